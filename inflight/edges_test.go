package inflight

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestNilLease: the nil Lease that TryAcquire and AcquireWithin return
// when there is no room is safe to release, extend and keep alive, as a
// caller who writes defer lease.Release(ctx) does: each says ErrNotHeld,
// and the accessors return zero values.
func TestNilLease(t *testing.T) {
	ctx := context.Background()
	l, err := NewLocal(PerResource(1))
	if err != nil {
		t.Fatal(err)
	}
	held, _, _ := l.TryAcquire(ctx, "r", "a")
	defer held.Release(ctx)
	le, ok, err := l.TryAcquire(ctx, "r", "b")
	if ok || err != nil || le != nil {
		t.Fatalf("TryAcquire with no room = %v, %v, %v; want a nil Lease, false, nil", le, ok, err)
	}
	if err := le.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("nil Release = %v, want ErrNotHeld", err)
	}
	if err := le.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("nil Extend = %v, want ErrNotHeld", err)
	}
	select {
	case err, open := <-le.KeepAlive(ctx):
		if !errors.Is(err, ErrNotHeld) || !open {
			t.Errorf("nil KeepAlive sent %v (open %v), want ErrNotHeld", err, open)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nil KeepAlive said nothing")
	}
	if le.ID() != "" || le.Resource() != "" || le.Client() != "" || le.Weight() != 0 || !le.Deadline().IsZero() {
		t.Errorf("nil accessors: %q %q %q %d %v, want zero values", le.ID(), le.Resource(), le.Client(), le.Weight(), le.Deadline())
	}
}
