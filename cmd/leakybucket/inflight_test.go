package main

import (
	"context"
	"strings"
	"testing"

	"github.com/leakybucket/leakybucket/inflight"
)

// TestInFlight: the inflight subcommand shows the weight held, the line,
// and each lease's client, weight and id.
func TestInFlight(t *testing.T) {
	r := newTestRedis(t)
	l, err := inflight.New(r.rdb, inflight.PerResource(5), inflight.WithPrefix(r.prefix))
	if err != nil {
		t.Fatal(err)
	}
	le, _, err := l.TryAcquireN(context.Background(), "exports", "tenant 42", 3)
	if err != nil || le == nil {
		t.Fatal(err)
	}
	code, out, errOut := cli("-redis", r.url, "inflight", "-resource", "exports", "-limit", "5", "-lease-prefix", r.prefix)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{`resource "exports": 3 of 5 held, 0 waiting`, `"tenant 42"`, le.ID()} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if code, _, _ := cli("-redis", r.url, "inflight", "-resource", "exports"); code == 0 {
		t.Error("no -limit: exit 0")
	}
}
