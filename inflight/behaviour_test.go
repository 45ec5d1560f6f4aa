package inflight

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestTryAcquireAndRelease(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		l := e.limiter(t, PerResource(3), PerClient(2))
		a, ok, err := l.TryAcquireN(ctx, "r", "alice", 2)
		if err != nil || !ok {
			t.Fatalf("TryAcquireN(2) = %v, %v", ok, err)
		}
		if _, ok, err := l.TryAcquire(ctx, "r", "alice"); err != nil || ok {
			t.Fatalf("alice's third unit: ok=%v err=%v, want refused by her limit", ok, err)
		}
		b, ok, err := l.TryAcquire(ctx, "r", "bob")
		if err != nil || !ok {
			t.Fatalf("bob: %v %v", ok, err)
		}
		if _, ok, _ := l.TryAcquire(ctx, "r", "carol"); ok {
			t.Fatal("carol admitted past the resource's limit")
		}
		u, err := l.Held(ctx, "r")
		if err != nil || u.Held != 3 || len(u.Holders) != 2 {
			t.Fatalf("Held = %+v, %v", u, err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(ctx); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("second Release = %v, want ErrNotHeld", err)
		}
		if err := l.Release(ctx, b.ID()); err != nil {
			t.Fatalf("Release by id: %v", err)
		}
		if err := l.Release(ctx, b.ID()); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Release by id again = %v", err)
		}
		c, ok, err := l.TryAcquireN(ctx, "r", "carol", 2)
		if !ok || err != nil {
			t.Fatalf("carol after releases: %v %v", ok, err)
		}
		_ = c.Release(ctx)
	})
}

func TestBadInput(t *testing.T) {
	if _, err := NewLocal(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("no limit: %v", err)
	}
	if _, err := NewLocal(PerResource(-1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative: %v", err)
	}
	l, _ := NewLocal(PerResource(2))
	ctx := context.Background()
	if _, _, err := l.TryAcquireN(ctx, "r", "c", 3); !errors.Is(err, ErrTooHeavy) {
		t.Fatalf("too heavy: %v", err)
	}
	if _, _, err := l.TryAcquireN(ctx, "r", "c", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zero: %v", err)
	}
	if err := l.Release(ctx, "nonsense"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad id: %v", err)
	}
	if _, err := New(nil, PerResource(1)); !errors.Is(err, ErrUnsupportedClient) {
		t.Fatalf("nil client: %v", err)
	}
}

func TestExpiryAndExtend(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		// Extended every tenth of its ttl, kept outlives a stall of the
		// test process of most of a ttl (the miniredis and real-Redis
		// envs run on the real clock, beside other work); dead expires
		// as the loop runs past its ttl.
		const ttl, every, extensions = 500 * time.Millisecond, 50 * time.Millisecond, 12
		l := e.limiter(t, PerResource(1), WithTTL(ttl))
		dead, _, err := l.TryAcquire(ctx, "r", "dead")
		if err != nil || dead == nil {
			t.Fatal(dead, err)
		}
		kept, ok, err := l.TryAcquire(ctx, "other", "kept")
		if err != nil || !ok {
			t.Fatal(err)
		}
		if _, ok, _ := l.TryAcquire(ctx, "r", "x"); ok {
			t.Fatal("admitted while held")
		}
		for range extensions {
			time.Sleep(every)
			if err := kept.Extend(ctx, ttl); err != nil {
				t.Fatalf("Extend: %v", err)
			}
		}
		// dead's holder never extended: it stopped counting.
		x, ok, err := l.TryAcquire(ctx, "r", "x")
		if err != nil || !ok {
			t.Fatalf("after the ttl: %v %v", ok, err)
		}
		if err := dead.Release(ctx); !errors.Is(err, ErrExpired) {
			t.Fatalf("Release after expiry = %v, want ErrExpired", err)
		}
		if err := dead.Extend(ctx, ttl); !errors.Is(err, ErrExpired) {
			t.Fatalf("Extend after expiry = %v, want ErrExpired", err)
		}
		// The expired release freed nothing: x still holds r.
		if _, ok, _ := l.TryAcquire(ctx, "r", "y"); ok {
			t.Fatal("an expired lease's release freed x's room")
		}
		// kept, extended every tenth of a ttl for more than a ttl, still
		// holds.
		if _, ok, _ := l.TryAcquire(ctx, "other", "y"); ok {
			t.Fatal("an extended lease lost its room")
		}
		for _, le := range []*Lease{x, kept} {
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestAcquireWaitsInOrder(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		l := e.limiter(t, PerResource(1))
		first, _, err := l.TryAcquire(ctx, "r", "h")
		if err != nil {
			t.Fatal(err)
		}
		type served struct {
			who string
			le  *Lease
			err error
		}
		got := make(chan served, 3)
		for i, who := range []string{"a", "b", "c"} {
			go func() {
				le, err := l.Acquire(ctx, "r", who)
				got <- served{who, le, err}
			}()
			waitForWaiters(t, l, "r", i+1) // arrive in order
		}
		// A newcomer is refused while others wait, even with room.
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"a", "b", "c"} {
			s := <-got
			if s.err != nil {
				t.Fatalf("Acquire(%s) = %v", s.who, s.err)
			}
			if s.who != want {
				t.Fatalf("served %s, want %s", s.who, want)
			}
			time.Sleep(20 * time.Millisecond)
			if err := s.le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// A waiter whose context ends holds nothing.
		h, _, _ := l.TryAcquire(ctx, "r", "h")
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := l.Acquire(cctx, "r", "late"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire past its deadline = %v", err)
		}
		_ = h.Release(ctx)
		le, err := l.Acquire(ctx, "r", "next")
		if err != nil {
			t.Fatal(err)
		}
		_ = le.Release(ctx)
	})
}

// Waiters of one process keep their order however their stamps fall: in
// one millisecond, across a correction of the clock's estimate back, or
// past a thousand in one millisecond; and a later millisecond starts its
// own scores, on every process's scale.
func TestArrivalsKeepTheirOrder(t *testing.T) {
	var a arrivals
	const ms = int64(1_764_331_234_567) // today's Redis time, 41 bits
	var last float64
	for i, at := range []int64{ms, ms, ms, ms - 3, ms, ms + 1} {
		s := a.next(float64(at))
		if s <= last || s < float64(at) {
			t.Fatalf("arrival %d stamped %d scored %v after %v: want more than the one before and at least its stamp", i, at, s, last)
		}
		last = s
	}
	for range 2000 {
		if s := a.next(float64(ms + 1)); s <= last {
			t.Fatalf("in one millisecond, %v after %v", s, last)
		} else {
			last = s
		}
	}
	if s := a.next(float64(ms + 10)); s != float64(ms+10) {
		t.Fatalf("a later millisecond scored %v, want %d", s, ms+10)
	}
}
