package inflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
	checkNilLease(t, le)
}

// checkNilLease checks what the methods of le, a nil Lease, say.
func checkNilLease(t *testing.T, le *Lease) {
	t.Helper()
	ctx := context.Background()
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
	type accessors struct {
		id, resource, client string
		weight               int
		deadline             time.Time
	}
	if got := (accessors{le.ID(), le.Resource(), le.Client(), le.Weight(), le.Deadline()}); got != (accessors{}) {
		t.Errorf("nil accessors: %+v, want zero values", got)
	}
}

// TestEmptyResourceOrClient: an empty resource or client is refused as
// the Bucket refuses them, with ErrInvalid naming which, and nothing is
// held or written.
func TestEmptyResourceOrClient(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		l := e.limiter(t, PerResource(1))
		for _, c := range []struct{ resource, client, names string }{
			{"", "c", "resource"},
			{"r", "", "client"},
		} {
			calls := map[string]func() (*Lease, error){
				"TryAcquire": func() (*Lease, error) { le, _, err := l.TryAcquire(ctx, c.resource, c.client); return le, err },
				"Acquire":    func() (*Lease, error) { return l.Acquire(ctx, c.resource, c.client) },
				"AcquireWithin": func() (*Lease, error) {
					return l.AcquireWithin(ctx, c.resource, c.client, 1, time.Second)
				},
			}
			for name, call := range calls {
				le, err := call()
				if le != nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "empty "+c.names) {
					t.Errorf("%s(%q, %q) = %v, %v; want no lease and ErrInvalid naming the empty %s", name, c.resource, c.client, le, err, c.names)
				}
			}
		}
		if _, err := l.Held(ctx, ""); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "empty resource") {
			t.Errorf("Held(\"\") = %v, want ErrInvalid naming the empty resource", err)
		}
		// Nothing was taken: the one unit of r is free.
		le, ok, err := l.TryAcquire(ctx, "r", "c")
		if !ok || err != nil {
			t.Fatalf("r after the refusals: %v, %v; want its room free", ok, err)
		}
		_ = le.Release(ctx)
	})
}

// TestEmptyResourceWritesNothing: the refusal sends nothing to Redis.
func TestEmptyResourceWritesNothing(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	l, err := New(rdb, PerResource(1))
	if err != nil {
		t.Fatal(err)
	}
	_, _, _ = l.TryAcquire(context.Background(), "", "c")
	_, _, _ = l.TryAcquire(context.Background(), "r", "")
	if keys := m.Keys(); len(keys) != 0 || m.CommandCount() != 0 {
		t.Errorf("refused calls sent %d commands, wrote %q", m.CommandCount(), keys)
	}
}

// TestLimitOptions: a limit out of range, 0 included, is refused with a
// message that names the option and says what is accepted, whether or
// not another limit is given; so is a Limiter without any.
func TestLimitOptions(t *testing.T) {
	for _, c := range []struct {
		opts []Option
		says string
	}{
		{[]Option{PerResource(0), PerClient(1)}, "PerResource(0)"},
		{[]Option{PerResource(1), PerClient(0)}, "PerClient(0)"},
		{[]Option{PerResource(0)}, "PerResource(0)"},
		{[]Option{PerResource(-3)}, "PerResource(-3)"},
		{[]Option{PerClient(MaxLimit + 1)}, "PerClient(65537)"},
		{nil, "PerResource(n) or PerClient(n)"},
	} {
		_, err := NewLocal(c.opts...)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "[1, 65536]") {
			t.Errorf("%s: %v, want ErrInvalid naming %s and saying [1, 65536]", c.says, err, c.says)
		}
	}
}

// TestErrorsSayWhatIsAccepted: each input error says what would be
// accepted.
func TestErrorsSayWhatIsAccepted(t *testing.T) {
	ctx := context.Background()
	l, _ := NewLocal(PerResource(2))
	_, _, tooHeavy := l.TryAcquireN(ctx, "r", "c", 3)
	_, _, zero := l.TryAcquireN(ctx, "r", "c", 0)
	_, _, ttl := l.TryAcquire(ctx, "r", "c", LeaseTTL(time.Microsecond))
	_, prefix := NewLocal(PerResource(1), WithPrefix(""))
	_, client := New(redis.UniversalClient(nil), PerResource(1))
	for _, c := range []struct {
		err   error
		is    error
		wants string
	}{
		{tooHeavy, ErrTooHeavy, "at most 2"},
		{zero, ErrInvalid, "1 or more"},
		{ttl, ErrInvalid, "1ms or more"},
		{prefix, ErrInvalid, "non-empty"},
		{client, ErrUnsupportedClient, "*redis.Client, *redis.ClusterClient or *redis.Ring"},
	} {
		if !errors.Is(c.err, c.is) || !strings.Contains(c.err.Error(), c.wants) {
			t.Errorf("%v: want %v saying %q", c.err, c.is, c.wants)
		}
	}
}

// TestPrefixWithBrace: a prefix with a brace would move the hash tag
// that keeps a resource's keys in one cluster slot: refused, as the
// Bucket refuses it, saying what would be accepted.
func TestPrefixWithBrace(t *testing.T) {
	for _, p := range []string{"a{b", "a}b", "{x}"} {
		_, local := NewLocal(PerResource(1), WithPrefix(p))
		_, remote := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), PerResource(1), WithPrefix(p))
		for _, err := range []error{local, remote} {
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "without '{' or '}'") {
				t.Errorf("WithPrefix(%q): %v, want ErrInvalid saying what is accepted", p, err)
			}
		}
	}
}
