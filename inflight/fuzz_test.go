package inflight

import (
	"context"
	"errors"
	"testing"
)

// FuzzParseID: an id from a user is either rejected with ErrInvalid or
// names a lease whose ID is the id itself; and Release by it never
// panics, nor frees a lease it does not name.
func FuzzParseID(f *testing.F) {
	f.Add("cg.YWxpY2U.AAAAAAAAAAAAAAAA.2")
	f.Add("...")
	f.Add("a.b.c.0")
	f.Add("cg.YWxpY2U.AAAA.01")
	l, _ := NewLocal(PerResource(3))
	held, _, _ := l.TryAcquire(context.Background(), "r", "alice")
	f.Fuzz(func(t *testing.T, id string) {
		le, err := ParseID(id)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseID(%q) = %v, not ErrInvalid", id, err)
			}
			return
		}
		if le.ID() != id {
			t.Fatalf("ParseID(%q).ID() = %q", id, le.ID())
		}
		if id != held.ID() {
			_ = l.Release(context.Background(), id)
			if u, _ := l.Held(context.Background(), "r"); u.Held != 1 {
				t.Fatalf("Release(%q) freed %s", id, held.ID())
			}
		}
	})
}
