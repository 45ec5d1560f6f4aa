package store

import (
	"fmt"
	"testing"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// A client's calls always queue in one line; the clients of a resource
// whose rules are all per-client are split among clientLines lines, and
// share the resource's one line otherwise.
func TestLineOfAClient(t *testing.T) {
	ks := keys.Of("lb:s", "r")
	for _, scoped := range []bool{true, false} {
		l := lockFree{clientScoped: scoped}
		lines := map[string]bool{}
		for c := range 100 {
			client := fmt.Sprint("c", c)
			line := l.Line(ks, client)
			if again := l.Line(ks, client); again != line {
				t.Fatalf("clientScoped %v: client %s queued in %q, then in %q", scoped, client, line, again)
			}
			lines[line] = true
		}
		want := 1
		if scoped {
			want = clientLines
		}
		if len(lines) != want {
			t.Errorf("clientScoped %v: 100 clients of one resource queued in %d lines, want %d", scoped, len(lines), want)
		}
		if other := l.Line(keys.Of("lb:s", "other"), "c0"); lines[other] {
			t.Errorf("clientScoped %v: another resource's client queued in a line of r's", scoped)
		}
	}
}
