package leakybucket

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// Many waiters on one key are all admitted, as the window frees room, and
// never more than the limit in any window. On fake time the admissions are
// checked window by window, to the millisecond of Redis time; on a real
// server, where each admission lands a round trip after Redis stamped it,
// by the time they took: k per window cannot admit n faster.
func TestWaitAdmitsEveryWaiterWithinTheLimit(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		const k, waiters = 3, 10
		w := time.Second
		if e.real {
			w = 300 * ms // keeps the real runs short
		}
		b := e.bucket(t, PerResource(Per(k, w)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		var mu sync.Mutex
		var admitted []time.Duration
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() {
				if err := b.Wait(ctx, "r", "c"); err != nil {
					t.Errorf("Wait: %v", err)
					return
				}
				mu.Lock()
				admitted = append(admitted, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(admitted) != waiters {
			t.Fatalf("%d of %d waiters admitted", len(admitted), waiters)
		}
		slices.Sort(admitted)
		rounds := (waiters + k - 1) / k
		if least := time.Duration(rounds-1) * w; admitted[waiters-1] < least-5*ms {
			t.Errorf("the last of %d waiters was admitted after %v; %d per %v cannot admit them before %v", waiters, admitted[waiters-1], k, w, least)
		}
		if e.real {
			return
		}
		for i, at := range admitted {
			in := 0
			for _, before := range admitted[:i+1] {
				if at.Truncate(ms)-before.Truncate(ms) < w {
					in++
				}
			}
			if in > k {
				t.Errorf("admission %d at %v: %d admitted in the window ending then, limit %d (all: %v)", i, at, in, k, admitted)
			}
		}
		// Each round is late by at most one jitter: the slots free when the
		// previous round's winners were admitted.
		if most := time.Duration(rounds-1)*w + time.Duration(rounds)*maxJitter; admitted[waiters-1] > most {
			t.Errorf("the last waiter was admitted after %v, want at most %v", admitted[waiters-1], most)
		}
	})
}

// A wait that fits before the deadline is slept, with its jitter of at
// most a tenth, and then admitted.
func TestWaitSleepsRetryAfter(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		const window = 200 * ms
		b := e.bucket(t, PerClient(Per(1, window)))
		// The window starts when Redis stamps the first call: between
		// before and when Allow returns, on a real server.
		before := time.Now()
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		if err := b.Wait(ctx, "r", "c"); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		took := time.Since(start)
		if since := time.Since(before); since < window-ms {
			t.Errorf("Wait admitted the call %v after the first, within its window of %v", since, window)
		}
		if !e.real && took > window+window/10 {
			t.Errorf("Wait took %v, want at most %v: the wait and a jitter of a tenth", took, window+window/10)
		}
	})
}

// A denial whose RetryAfter outlasts the context's deadline ends Wait at
// once, without sleeping (on fake time: no time passes), with an error
// that matches context.DeadlineExceeded and says why; nothing is recorded.
func TestWaitRefusesAWaitPastTheDeadline(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(PerMinute(1)))
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := b.WaitN(ctx, "r", "c", 1)
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "would exceed context deadline") {
			t.Errorf("Wait: %v, want DeadlineExceeded that says it would exceed the deadline", err)
		}
		if ctx.Err() != nil {
			t.Errorf("the context ended: Wait waited for its deadline")
		}
		if (!e.real && took != 0) || took > time.Second {
			t.Errorf("Wait took %v to refuse, want at once", took)
		}
		if res, err := b.Peek(context.Background(), "r", "c"); err != nil || res.Rules[0].Used != 1 {
			t.Errorf("Peek after the refused Wait = %+v, %v; want only the first call counted", res, err)
		}
	})
}

// A context cancelled during the sleep ends Wait then, with its error; one
// cancelled before ends it before anything is sent.
func TestWaitEndsWithItsContext(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(PerMinute(1)))
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("Allow = %+v, %v", res, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		time.AfterFunc(100*ms, cancel)
		err := b.Wait(ctx, "r", "c")
		took := time.Since(start)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Wait cancelled after 100ms: %v, want context.Canceled", err)
		}
		if (!e.real && took != 100*ms) || took < 100*ms || took > 10*time.Second {
			t.Errorf("Wait cancelled after 100ms returned after %v", took)
		}
		trips := e.trips.count(func() {
			if err := b.Wait(ctx, "r", "other"); !errors.Is(err, context.Canceled) {
				t.Errorf("Wait with a cancelled context: %v, want context.Canceled", err)
			}
		})
		if trips != 0 {
			t.Errorf("Wait with a cancelled context made %d round trips, want none", trips)
		}
	})
}

// Bad input is refused at once, before anything is sent.
func TestWaitBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		b := e.bucket(t, PerClient(Per(3, time.Minute)))
		for _, c := range []struct {
			resource, client string
			n                int
			want             error
		}{
			{"r", "c", 0, ErrInvalidWeight},
			{"r", "c", 4, ErrInvalidWeight},
			{"", "c", 1, ErrEmptyResource},
			{"r", "", 1, ErrEmptyClient},
		} {
			var err error
			if trips := e.trips.count(func() { err = b.WaitN(context.Background(), c.resource, c.client, c.n) }); trips != 0 {
				t.Errorf("WaitN(%q, %q, %d) made %d round trips", c.resource, c.client, c.n, trips)
			}
			if !errors.Is(err, c.want) {
				t.Errorf("WaitN(%q, %q, %d): %v, want %v", c.resource, c.client, c.n, err, c.want)
			}
		}
	})
}

// An error of Allow is returned as it is, at once: Wait waits out denials,
// not failures.
func TestWaitReturnsAllowErrors(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	b, err := New(rdb, PerClient(PerMinute(1)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = b.Wait(ctx, "r", "c")
	if !errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		t.Errorf("Wait on a closed port: %v (context: %v), want ErrUnavailable before the deadline", err, ctx.Err())
	}
}
