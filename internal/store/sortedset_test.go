package store

import (
	"strings"
	"testing"
)

// Every unit of every call is a member of its own, short, and a member of a
// per-resource set starts with its client's prefix (which Flush removes)
// and no other client's.
func TestMembersAreDistinct(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, spec := range []setSpec{{perClient: true}, {}} {
		for range 200 {
			id := callID()
			if len(id) != 11 || strings.ContainsAny(id, ":~") {
				t.Fatalf("id %q: want 11 characters of base64url", id)
			}
			for unit := range 120 {
				m := member(spec, "client", id, unit)
				if seen[m] {
					t.Fatalf("member %q made twice", m)
				}
				seen[m] = true
				rest, ok := strings.CutPrefix(m, memberPrefix("client"))
				if ok == spec.perClient || len(rest) > 14 || !strings.HasPrefix(rest, id) {
					t.Fatalf("member %q of call %q, unit %d (per client: %v)", m, id, unit, spec.perClient)
				}
				if strings.HasPrefix(m, memberPrefix("clien")) {
					t.Fatalf("member %q starts with another client's prefix", m)
				}
			}
		}
	}
}
