package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/memorystore"
)

// The fallback's logic on fake time: miniredis in a synctest bubble
// behind an outageSwitch, for every strategy. fallback_kill_test.go kills
// real servers under load.

// switches returns the observed calls' Fallback, with each run of equal
// values told once: [false true false] for a switch there and back.
func (ds *decisions) switches() []bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	var out []bool
	for _, dec := range ds.all {
		if dec.Op != opAllow && dec.Op != opPeek || dec.Err != nil {
			continue
		}
		if len(out) == 0 || out[len(out)-1] != dec.Fallback {
			out = append(out, dec.Fallback)
		}
	}
	return out
}

// fallbackNew returns a Bucket on rdb with opts, or fails the test.
func fallbackNew(t *testing.T, rdb redis.UniversalClient, opts ...Option) *Bucket {
	t.Helper()
	b, err := New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFallbackSwitch: a Bucket WithFallback(3) under a per-client rule
// of 10 a minute decides on Redis while it answers; once Redis is down,
// in process by the rule's share, 3 a minute, each Result and Decision
// saying Fallback and naming the share as the rule; a weight above the
// share is denied with RetryAfter Never and recorded nowhere; Peek and
// Usage read the process's counts; Flush forgets them and says that
// Redis's are left; and once Redis is back, calls go to it again, which
// counted nothing of the process's calls.
func TestFallbackSwitch(t *testing.T) {
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { testFallbackSwitch(t, s) })
		})
	}
}

func testFallbackSwitch(t *testing.T, s Strategy) {
	sw := newOutageSwitch(t, true)
	var seen decisions
	rule, share := PerClient(Per(10, time.Minute)), Rule{PerClient: true, Limit: Per(3, time.Minute)}
	b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(s), rule, WithFallback(3), WithObserver(seen.observe))
	ctx := context.Background()
	if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed || res.Fallback || res.Remaining != 9 {
		t.Fatalf("on Redis: %+v, %v; want admitted by Redis, 9 left", res, err)
	}
	sw.Down()
	start := time.Now()
	for i := range 3 {
		res, err := b.Allow(ctx, "r", "c")
		if err != nil || !res.Allowed || !res.Fallback || res.Remaining != 2-i || res.Rules[0].Rule != share {
			t.Fatalf("step %d in process: %+v, %v; want admitted in process, %d left of %v", i, res, err, 2-i, share)
		}
	}
	t.Logf("the first call in process after %v (the probe's)", time.Since(start))
	if took := time.Since(start); took > 20*time.Millisecond {
		t.Errorf("the first call of the outage took %v, want about 10ms", took)
	}
	res, err := b.Allow(ctx, "r", "c")
	if err != nil || res.Allowed || !res.Fallback || res.RetryAfter != time.Minute || !slices.Equal(res.DeniedBy, []Rule{share}) {
		t.Errorf("the 4th in process: %+v, %v; want denied by %v, retry after 1m", res, err, share)
	}
	if res, err := b.AllowN(ctx, "r", "c", 5); err != nil || res.Allowed || !res.Fallback || res.RetryAfter != Never {
		t.Errorf("AllowN(5) above the share: %+v, %v; want denied in process, RetryAfter Never", res, err)
	}
	if peek, err := b.Peek(ctx, "r", "c"); err != nil || peek.Allowed || !peek.Fallback || peek.Rules[0].Used != 3 {
		t.Errorf("Peek in process: %+v, %v; want denied, 3 used (AllowN(5) recorded nowhere)", peek, err)
	}
	if usage, err := b.Usage(ctx, "r", "c"); err != nil || usage[0].Used != 3 || usage[0].Rule != share {
		t.Errorf("Usage in process: %+v, %v; want 3 used of %v", usage, err, share)
	}
	if err := b.Flush(ctx, "r", "c"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Flush while Redis is down: %v, want ErrUnavailable (Redis's counts are left)", err)
	}
	if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed || !res.Fallback || res.Remaining != 2 {
		t.Errorf("after the Flush, in process: %+v, %v; want admitted, 2 left", res, err)
	}
	sw.Up()
	time.Sleep(time.Second) // the probe finds it back within its longest wait
	res, err = b.Allow(ctx, "r", "c")
	if err != nil || !res.Allowed || res.Fallback || res.Rules[0].Used != 2 || res.Rules[0].Rule != (Rule{PerClient: true, Limit: Per(10, time.Minute)}) {
		t.Errorf("back on Redis: %+v, %v; want admitted by Redis, which counts 2 (none of the process's)", res, err)
	}
	if got := seen.switches(); !slices.Equal(got, []bool{false, true, false}) {
		t.Errorf("the observer saw Fallback %v, want [false true false]", got)
	}
}

// TestFallbackCutCall: calls under way when Redis vanishes (its host
// gone: writes held, dials refused) are not cut with ErrUnavailable: the
// probe they make look opens the breaker after 10 ms, and they are decided
// in process. So is every call after them, at once.
func TestFallbackCutCall(t *testing.T) {
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sw := newOutageSwitch(t, true)
				b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(s), PerClient(Per(10, time.Minute)), WithFallback(1))
				ctx := context.Background()
				if _, err := b.Allow(ctx, "r", "c"); err != nil {
					t.Fatal(err)
				}
				sw.Hang()
				start := time.Now()
				var wg sync.WaitGroup
				for _, c := range []string{"a", "b", "c", "d"} {
					wg.Go(func() {
						res, err := b.Allow(ctx, "r", c)
						if err != nil || !res.Allowed || !res.Fallback {
							t.Errorf("client %s, under way when the breaker opened: %+v, %v; want admitted in process", c, res, err)
						}
					})
				}
				wg.Wait()
				if took := time.Since(start); took < 10*time.Millisecond || took > 20*time.Millisecond {
					t.Errorf("the calls under way took %v, want the probe's 10ms", took)
				}
				start = time.Now()
				if res, err := b.Allow(ctx, "r", "e"); err != nil || !res.Fallback || time.Since(start) != 0 {
					t.Errorf("a call once the breaker is open: %+v, %v after %v; want decided in process at once", res, err, time.Since(start))
				}
			})
		})
	}
}

// TestFallbackTiers: each tier's Bucket falls back to its own share of
// its own rules, and the tiers share their breakers: once one tier's call
// found Redis gone, the other's first call is decided in process at once.
func TestFallbackTiers(t *testing.T) {
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sw := newOutageSwitch(t, true)
				tiers, err := NewTiers(sw.client(t, redis.Options{}), WithStrategy(s), WithFallback(2))
				if err != nil {
					t.Fatal(err)
				}
				if err := tiers.Set("free", PerClient(Per(10, time.Minute))); err != nil {
					t.Fatal(err)
				}
				if err := tiers.Set("pro", PerClient(Per(100, time.Minute))); err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				for _, tier := range []string{"free", "pro"} {
					if res, err := tiers.Allow(ctx, tier, "r", "c-"+tier); err != nil || res.Fallback {
						t.Fatalf("%s on Redis: %+v, %v", tier, res, err)
					}
				}
				sw.Down()
				for tier, share := range map[string]int{"free": 5, "pro": 50} {
					start := time.Now()
					admitted := 0
					for range share + 5 {
						res, err := tiers.Allow(ctx, tier, "r", "c-"+tier)
						if err != nil || !res.Fallback {
							t.Fatalf("%s in process: %+v, %v", tier, res, err)
						}
						if res.Allowed {
							admitted++
						}
					}
					if admitted != share {
						t.Errorf("%s admitted %d in process, want its share %d", tier, admitted, share)
					}
					t.Logf("%s: %d calls in process in %v", tier, share+5, time.Since(start))
				}
				sw.Up()
				time.Sleep(time.Second)
				if res, err := tiers.Allow(ctx, "pro", "r", "c-pro"); err != nil || res.Fallback || res.Rules[0].Used != 2 {
					t.Errorf("pro back on Redis: %+v, %v; want 2 used there", res, err)
				}
			})
		})
	}
}

// TestFallbackWait: WaitN during an outage waits as the fallback's
// denials say, and, for a weight above a rule's share, until Redis is
// back.
func TestFallbackWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sw := newOutageSwitch(t, true)
		b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(SortedSet), PerClient(Per(4, time.Second)), WithFallback(2))
		ctx := context.Background()
		sw.Down()
		for range 2 {
			if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed || !res.Fallback {
				t.Fatalf("in process: %+v, %v", res, err)
			}
		}
		start := time.Now()
		if err := b.Wait(ctx, "r", "c"); err != nil {
			t.Fatalf("Wait in process: %v", err)
		}
		if took := time.Since(start); took < time.Second-10*time.Millisecond || took > time.Second+100*time.Millisecond {
			t.Errorf("Wait in process took %v, want the share's window, 1s", took)
		}
		go func() {
			time.Sleep(2 * time.Second)
			sw.Up()
		}()
		start = time.Now()
		if err := b.WaitN(ctx, "r", "other", 3); err != nil {
			t.Fatalf("WaitN(3) above the share of 2: %v", err)
		}
		if took := time.Since(start); took < 2*time.Second || took > 2500*time.Millisecond {
			t.Errorf("WaitN(3) above the share took %v, want Redis back after 2s, and then the probe", took)
		}
	})
}

// TestFallbackOptions: WithFallback's instances must be at least 1 and
// at most every rule's Requests, with the breaker on; NewLocal accepts it.
func TestFallbackOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: New sends nothing
	defer rdb.Close()
	for name, opts := range map[string][]Option{
		"zero instances":     {PerClient(Per(10, time.Minute)), WithFallback(0)},
		"negative instances": {PerClient(Per(10, time.Minute)), WithFallback(-1)},
		"a share of nothing": {PerClient(Per(10, time.Minute)), PerResource(Per(2, time.Second)), WithFallback(3)},
		"without a breaker":  {PerClient(Per(10, time.Minute)), WithFallback(1), WithoutBreaker()},
	} {
		if _, err := New(rdb, opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: New = %v, want ErrInvalidOption", name, err)
		}
		if _, err := NewLocal(opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: NewLocal = %v, want ErrInvalidOption, as New", name, err)
		}
	}
	b, err := NewLocal(PerClient(Per(10, time.Minute)), WithFallback(3))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.Allow(context.Background(), "r", "c"); err != nil || res.Fallback || res.Remaining != 9 {
		t.Errorf("NewLocal WithFallback: %+v, %v; want the whole rule, no fallback", res, err)
	}
}

// TestFallbackForgets: what the process counted during an outage is freed
// once it has left its windows, by the calls decided on Redis after it,
// as NewLocal's calls free what they no longer count: an outage's clients
// do not stay in memory.
func TestFallbackForgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sw := newOutageSwitch(t, true)
		b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(SortedSet), PerClient(Per(10, time.Second)), WithFallback(2))
		ctx := context.Background()
		sw.Down()
		for c := range 100 {
			if res, err := b.Allow(ctx, "r", fmt.Sprint("c", c)); err != nil || !res.Fallback {
				t.Fatalf("client %d in process: %+v, %v", c, res, err)
			}
		}
		local := b.counts.(*fallback).local.counts
		if n := len(local.Keys()); n != 100 {
			t.Fatalf("the process counts %d clients, want 100", n)
		}
		sw.Up()
		time.Sleep(2 * time.Second) // Redis back, the outage's calls out of their windows
		for range memorystore.SweepCycle {
			if res, err := b.Allow(ctx, "r", "on-redis"); err != nil || res.Fallback {
				t.Fatalf("on Redis: %+v, %v", res, err)
			}
		}
		if keys := local.Keys(); len(keys) != 0 {
			t.Errorf("the process still counts %d clients after the outage: %v", len(keys), keys[:min(len(keys), 5)])
		}
	})
}
