package leakybucket

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// refundRule drains one unit every 100 ms and holds 10.
var refundRule = PerResource(Per(10, time.Second))

// admitN admits a call of weight n, which must be admitted.
func admitN(t *testing.T, b *Bucket, n int) *Admission {
	t.Helper()
	a, res, err := b.Admit(context.Background(), "r", "c", n)
	if err != nil || !res.Allowed || a == nil {
		t.Fatalf("Admit(%d) = %v, %+v, %v; want admitted", n, a, res, err)
	}
	return a
}

// refund refunds n of a, and wants back returned.
func refund(t *testing.T, b *Bucket, a *Admission, n, want int) {
	t.Helper()
	got, err := b.Refund(context.Background(), a, n)
	if err != nil || got != want {
		t.Fatalf("Refund(%d) = %d, %v; want %d", n, got, err, want)
	}
}

// remaining is what a call of weight 1 would leave now.
func remaining(t *testing.T, b *Bucket) int {
	t.Helper()
	res, err := b.Peek(context.Background(), "r", "c")
	if err != nil {
		t.Fatal(err)
	}
	if !res.Allowed {
		return 0
	}
	return res.Remaining + 1
}

// wantRoom fails the test unless the room for calls of weight 1 is want.
func wantRoom(t *testing.T, b *Bucket, want int, what string) {
	t.Helper()
	if got := remaining(t, b); got != want {
		t.Fatalf("%s = %d, want %d", what, got, want)
	}
}

// A refund gives its room back once: the same call admitted again, and
// nothing more; a second refund returns 0.
func TestRefundRestoresRoomOnce(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, refundRule)
		first := admitN(t, b, 3)
		admitN(t, b, 7)
		if got := remaining(t, b); got != 0 {
			t.Fatalf("room after 10 = %d", got)
		}
		refund(t, b, first, 3, 3)
		wantRoom(t, b, 3, "room after the refund")
		refund(t, b, first, 3, 0)
		refund(t, b, first, 1, 0)
		wantRoom(t, b, 3, "room after a second refund")
		admitN(t, b, 3)
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || res.Allowed {
			t.Fatalf("Allow past the refunded room = %+v, %v", res, err)
		}
	})
}

// A refund of part of a call gives that part, and the rest later; never
// more than was admitted.
func TestRefundPartial(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, refundRule)
		admitN(t, b, 6)
		a := admitN(t, b, 4)
		refund(t, b, a, 1, 1)
		if a.Held() != 3 || remaining(t, b) != 1 {
			t.Fatalf("after refunding 1 of 4: held %d, room %d; want 3, 1", a.Held(), remaining(t, b))
		}
		refund(t, b, a, 100, 3)
		refund(t, b, a, 1, 0)
		wantRoom(t, b, 4, "room")
	})
}

// Weight that drained since the call returns nothing: only what the call
// still holds comes back.
func TestRefundAfterDrain(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, refundRule)
		a := admitN(t, b, 3)
		c := admitN(t, b, 3)
		time.Sleep(150 * ms)  // 1.5 units drained, counted from each decision
		refund(t, b, a, 3, 2) // 1.5 units back, rounded up
		if a.Held() != 1 {
			t.Fatalf("held %d after 2 back, want 1", a.Held())
		}
		time.Sleep(150 * ms) // 3 units drained since the decisions
		refund(t, b, c, 3, 0)
		refund(t, b, a, 3, 0)
		// Of the 6 admitted, 3 drained and 1.5 came back: 1.5 held,
		// Used rounds it up.
		wantRoom(t, b, 8, "room")
	})
}

// Bad input is an error that writes nothing; a denial has nothing to
// refund.
func TestRefundBadInput(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b, other := e.bucket(t, refundRule), e.bucket(t, refundRule)
		a := admitN(t, b, 10)
		ctx := context.Background()
		foreign, _, err := other.Admit(ctx, "elsewhere", "c", 1)
		if foreign == nil || err != nil {
			t.Fatalf("Admit = %v, %v", foreign, err)
		}
		for name, c := range map[string]struct {
			a    *Admission
			n    int
			want error
		}{
			"nil": {nil, 1, ErrInvalidAdmission}, "zero": {&Admission{}, 1, ErrInvalidAdmission},
			"foreign": {foreign, 1, ErrInvalidAdmission}, "n=0": {a, 0, ErrInvalidWeight}, "n<0": {a, -1, ErrInvalidWeight},
		} {
			if got, err := b.Refund(ctx, c.a, c.n); got != 0 || !errors.Is(err, c.want) {
				t.Errorf("%s: Refund = %d, %v; want 0, %v", name, got, err, c.want)
			}
		}
		if got := remaining(t, b); got != 0 || a.Held() != 10 {
			t.Fatalf("bad refunds gave back room: room %d, held %d", got, a.Held())
		}
		denied, res, err := b.Admit(ctx, "r", "c", 1)
		if denied != nil || res.Allowed || err != nil {
			t.Fatalf("Admit when full = %v, %+v, %v; want no Admission", denied, res, err)
		}
		if over, res, err := b.Admit(ctx, "r", "c", 11); over != nil || res.RetryAfter != Never || err != nil {
			t.Fatalf("Admit over the burst = %v, %+v, %v", over, res, err)
		}
	})
}

// Only GCRA gives weight back so far: the others refuse Admit, sending
// nothing.
func TestRefundUnsupported(t *testing.T) {
	for _, s := range []Strategy{Logs, SortedSet, Windows(time.Second), FixedWindows} {
		b, err := NewLocal(WithStrategy(s), refundRule)
		if err != nil {
			t.Fatal(err)
		}
		if a, _, err := b.Admit(context.Background(), "r", "c", 1); a != nil || !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%v: Admit = %v, %v; want ErrUnsupported", s, a, err)
		}
	}
}

// Per-client and per-resource rules: a refund gives back to each the same
// weight, so the client's room and the resource's both come back.
func TestRefundEveryRule(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(Per(10, time.Second)), PerClient(Per(4, time.Second)))
		a := admitN(t, b, 4)
		if res, _ := b.Allow(context.Background(), "r", "c"); res.Allowed {
			t.Fatal("the client's rule admitted past 4")
		}
		refund(t, b, a, 2, 2)
		res, err := b.AllowN(context.Background(), "r", "c", 2)
		if err != nil || !res.Allowed || res.Rules[0].Used != 4 || res.Rules[1].Used != 4 {
			t.Fatalf("AllowN(2) after refunding 2 = %+v, %v", res, err)
		}
	})
}

// WithFallback: a call the fallback admitted while Redis was down is given
// back in process, where it was counted; one Redis admitted, on Redis.
func TestRefundFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sw := newOutageSwitch(t, true)
		b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(GCRA), PerClient(Per(6, time.Hour)), WithFallback(3))
		ctx := context.Background()
		onRedis := admitN(t, b, 6)
		sw.Down()
		inProcess := admitN(t, b, 2) // the share: 2 an hour
		if res, err := b.Allow(ctx, "r", "c"); err != nil || res.Allowed || !res.Fallback {
			t.Fatalf("past the share: %+v, %v", res, err)
		}
		refund(t, b, inProcess, 2, 2)
		admitN(t, b, 2)
		sw.Up()
		time.Sleep(time.Second) // the probe finds it back within its longest wait
		if res, err := b.Allow(ctx, "r", "c"); err != nil || res.Allowed || res.Fallback {
			t.Fatalf("on Redis again, full: %+v, %v", res, err)
		}
		refund(t, b, onRedis, 6, 6)
		admitN(t, b, 6)
	})
}

// A Flush or FlushAll took the call's weight out already: a Refund of a
// call admitted before it gives nothing back, so that the calls counted
// since keep their room (given back twice, the rule would admit a second
// burst within its span).
func TestRefundAfterFlush(t *testing.T) {
	for _, flush := range []struct {
		name string
		f    func(b *Bucket) error
	}{
		{"Flush", func(b *Bucket) error { return b.Flush(context.Background(), "r", "c") }},
		{"FlushAll", func(b *Bucket) error { return b.FlushAll(context.Background(), "r") }},
	} {
		t.Run(flush.name, func(t *testing.T) {
			eachGCRA(t, func(t *testing.T, e *env) {
				b := e.bucket(t, PerClient(Per(10, time.Minute))) // a unit drains every 6 s
				before := admitN(t, b, 10)
				if err := flush.f(b); err != nil {
					t.Fatal(err)
				}
				since := admitN(t, b, 10) // a full bucket again, counted since
				refund(t, b, before, 10, 0)
				if res, err := b.Allow(context.Background(), "r", "c"); err != nil || res.Allowed {
					t.Fatalf("Allow after the refund of a flushed call = %+v, %v; want denied", res, err)
				}
				refund(t, b, since, 10, 10) // a call of this generation is given back
				admitN(t, b, 9)
			})
		})
	}
}
