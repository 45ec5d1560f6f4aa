package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leakybucket/leakybucket/internal/memorystore"
)

// A local Bucket admits exactly the limit to 256 goroutines calling at
// once, as Buckets on one Redis do across processes (concurrency_test.go).
func TestConcurrentGoroutinesLocal(t *testing.T) {
	for strategy, s := range concurrentStrategies {
		for name, spec := range scenarios {
			t.Run(strategy+"/"+name, func(t *testing.T) {
				t.Parallel()
				b, err := NewLocal(append([]Option{WithStrategy(s)}, spec.rules...)...)
				if err != nil {
					t.Fatal(err)
				}
				admitted := callScenario(t, b, spec.clients, 256, make(chan struct{}))
				checkAdmitted(t, name, admitted)
			})
		}
	}
}

// A local Bucket gives the Results a Bucket on Redis gives, to the
// millisecond: the same random calls (weights, several rules, clients,
// Peek, Flush and FlushAll) on miniredis and in process, on one fake
// clock, for every strategy, with and without WithRecordDenied; and under
// Windows with several precisions and fixed windows in one Bucket.
func TestLocalMatchesRedis(t *testing.T) {
	rules := []Option{PerResource(Per(12, 1500*ms)), PerClient(Per(5, 300*ms)), PerClient(Per(3, 100*ms))}
	configs := map[Strategy][]Option{
		FixedWindows:     {PerResource(Per(12, 1500*ms)), PerResource(Per(8, 600*ms).WithPrecision(100 * ms)), PerClient(Per(5, 300*ms).WithPrecision(50 * ms)), PerClient(Per(3, 100*ms).WithPrecision(10 * ms)), PerClient(Per(4, 300*ms))},
		Windows(20 * ms): {PerResource(Per(12, 1500*ms).WithPrecision(100 * ms)), PerClient(Per(5, 300*ms)), PerClient(Per(3, 100*ms).WithPrecision(ms))},
	}
	for _, s := range strategies {
		configs[s] = rules
	}
	for s, rules := range configs {
		for _, recordDenied := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/recordDenied=%v", s, recordDenied), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					e := newMiniEnv(t, s)
					opts := slices.Clone(rules)
					if recordDenied {
						opts = append(opts, WithRecordDenied())
					}
					onRedis := e.bucket(t, opts...)
					local, err := NewLocal(append([]Option{WithStrategy(s)}, opts...)...)
					if err != nil {
						t.Fatal(err)
					}
					compareRandomCalls(t, onRedis, local, uint64(len(s.String())))
				})
			})
		}
	}
}

// compareRandomCalls makes the same 600 random calls on a and b, and fails
// at the first whose outcome differs.
func compareRandomCalls(t *testing.T, a, b *Bucket, seed uint64) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range 600 {
		time.Sleep(time.Duration(rng.IntN(40)) * ms)
		client, n := "c"+strconv.Itoa(rng.IntN(3)), 1+rng.IntN(3)
		var call string
		var do func(*Bucket) (any, error)
		switch k := rng.IntN(20); {
		case k == 0:
			call, do = "Flush "+client, func(b *Bucket) (any, error) { return nil, b.Flush(ctx, "r", client) }
		case k == 1:
			call, do = "FlushAll", func(b *Bucket) (any, error) { return nil, b.FlushAll(ctx, "r") }
		case k < 5:
			call, do = fmt.Sprintf("PeekN(%s, %d)", client, n), func(b *Bucket) (any, error) { return b.PeekN(ctx, "r", client, n) }
		default:
			call, do = fmt.Sprintf("AllowN(%s, %d)", client, n), func(b *Bucket) (any, error) { return b.AllowN(ctx, "r", client, n) }
		}
		got, gotErr := do(b)
		want, wantErr := do(a)
		if !sameResult(want, got, a) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("call %d, %s: in process %+v, %v; on Redis %+v, %v", i, call, got, gotErr, want, wantErr)
		}
	}
}

// sameResult reports whether onRedis, an answer of b, is the answer of an
// exact read, exact: equal to it, or for an AllowN of a Windows Bucket,
// which may decide a call far from its limits on a bound of its counts,
// within the bounds the Result's doc allows (see withinBounds).
func sameResult(onRedis, exact any, b *Bucket) bool {
	r, ok1 := onRedis.(Result)
	x, ok2 := exact.(Result)
	if ok1 && ok2 && boundsAdmissions(b) {
		return withinBounds(r, x, b.Rules())
	}
	return reflect.DeepEqual(onRedis, exact)
}

// boundsAdmissions reports whether b may answer an admission with a bound of its
// counts: a Windows Bucket on Redis.
func boundsAdmissions(b *Bucket) bool {
	r, ok := b.counts.(*remote)
	if !ok {
		return false
	}
	_, windows := r.cfg.strategy.(windowsStrategy)
	return windows
}

// withinBounds reports whether r is what Windows may answer where x is
// the exact Result: the same decision, DeniedBy and RetryAfter; and when
// admitted, each rule's Used at least the exact one and its Remaining at
// most, exact below a tenth of its Requests, ResetAfter at least the exact
// one; Remaining at most the exact one, and exact below a tenth of the
// least Requests; and every field exact on a denial.
func withinBounds(r, x Result, rules []Rule) bool {
	if !x.Allowed || !r.Allowed {
		return reflect.DeepEqual(r, x)
	}
	if r.RetryAfter != x.RetryAfter || len(r.DeniedBy) != 0 || len(r.Rules) != len(x.Rules) ||
		r.Remaining > x.Remaining || r.ResetAfter < x.ResetAfter {
		return false
	}
	least := rules[0].Limit.Requests
	for i, rr := range r.Rules {
		xr, limit := x.Rules[i], rules[i].Limit.Requests
		least = min(least, limit)
		exact := 10*xr.Remaining < limit
		if rr.Rule != xr.Rule || rr.Used < xr.Used || rr.Remaining > xr.Remaining || rr.ResetAfter < xr.ResetAfter ||
			rr.RetryAfter != xr.RetryAfter || exact && rr != xr {
			return false
		}
	}
	return 10*x.Remaining >= least || r.Remaining == x.Remaining
}

// The state of a key is freed once no window counts it: a million
// distinct clients, then a window later calls from a thousand others to
// another resource, leave the state of those thousand only.
func TestLocalMemoryBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b, err := NewLocal(PerResource(Per(10_000_000, time.Minute)), PerClient(Per(1, time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		const clients = 1_000_000
		for i := range clients {
			if res, err := b.Allow(ctx, "r", strconv.Itoa(i)); err != nil || !res.Allowed {
				t.Fatalf("client %d: %+v, %v", i, res, err)
			}
		}
		if n := len(localOf(b).counts.Keys()); n != clients+1 {
			t.Fatalf("%d scopes held after %d clients, want %d", n, clients, clients+1)
		}
		time.Sleep(time.Minute)
		for i := range memorystore.SweepCycle {
			if _, err := b.Allow(ctx, "other", strconv.Itoa(i%1000)); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(localOf(b).counts.Keys()); n > 1000+1 {
			t.Errorf("%d scopes held a window after the million, want at most the 1001 used since", n)
		}
	})
}

// AllowNInto gives AllowN's Results, in the Result it is given. With an
// error the Result is the zero one.
func TestAllowNInto(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(Per(100, time.Minute)), PerClient(Per(2, time.Minute)))
		var res Result
		for i, want := range []bool{true, true, false} {
			if err := b.AllowNInto(ctx, "r", "a", 1, &res); err != nil || res.Allowed != want || len(res.Rules) != 2 {
				t.Fatalf("call %d: AllowNInto = %+v, %v; want Allowed %v and 2 rules", i, res, err, want)
			}
		}
		if len(res.DeniedBy) != 1 || res.DeniedBy[0].Limit.Requests != 2 {
			t.Errorf("DeniedBy = %v, want the per-client rule", res.DeniedBy)
		}
		checkAllowNIntoErrors(t, b)
	})
}

// checkAllowNIntoErrors checks AllowNInto's errors: bad input leaves the
// zero Result, and a nil Result is refused.
func checkAllowNIntoErrors(t *testing.T, b *Bucket) {
	t.Helper()
	ctx := context.Background()
	res := Result{Allowed: true, Rules: make([]RuleResult, 2)}
	if err := b.AllowNInto(ctx, "r", "", 1, &res); !errors.Is(err, ErrEmptyClient) || res.Rules != nil || res.Allowed {
		t.Errorf("AllowNInto with no client = %+v, %v; want the zero Result and ErrEmptyClient", res, err)
	}
	if err := b.AllowNInto(ctx, "r", "a", 1, nil); !errors.Is(err, ErrNilResult) {
		t.Errorf("AllowNInto with no Result: %v, want ErrNilResult", err)
	}
}

// In process, AllowNInto on a key whose state is made allocates nothing,
// admitted or denied, with every strategy: it writes in the Result's room.
// (Not in a synctest bubble: AllocsPerRun runs alone, on the real clock,
// where a fixed window may end during the calls; its rule is sliding.)
func TestAllowNIntoAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	for _, s := range append(strategies, FixedWindows) {
		b, err := NewLocal(WithStrategy(s), PerResource(Per(1_000_000, time.Hour)), PerClient(Per(500, time.Hour).WithPrecision(exactFor(s))))
		if err != nil {
			t.Fatal(err)
		}
		var res Result
		_ = b.AllowNInto(ctx, "r", "a", 1, &res) // the key's state is made
		if n := testing.AllocsPerRun(1000, func() { _ = b.AllowNInto(ctx, "r", "a", 1, &res) }); n != 0 {
			t.Errorf("%v: AllowNInto in process: %v allocations a decision, want 0", s, n)
		}
		if res.Allowed {
			t.Errorf("%v: the 1001st call was admitted, want the denials measured too", s)
		}
		// AllowN makes a new Result, whose Rules (and, denied, DeniedBy)
		// are its only allocations: 500 admitted calls, then denied ones.
		_, _ = b.AllowN(ctx, "r", "c", 1)
		if n := testing.AllocsPerRun(1000, func() { _, _ = b.AllowN(ctx, "r", "c", 1) }); n > 1.5 {
			t.Errorf("%v: AllowN in process: %v allocations a decision, want 1 admitted and 2 denied", s, n)
		}
	}
}

// exactFor is the precision a rule may take under s: a minute under
// FixedWindows, none under the others.
func exactFor(s Strategy) time.Duration {
	if w, ok := s.(windowsStrategy); ok && w.fixed {
		return time.Minute
	}
	return 0
}

// After a churn, a local Bucket's memory comes back to what its live keys
// need within two windows: the shards' maps and the scopes' entries do not
// keep the room of their peak. 100 000 distinct clients of one resource
// within a window, then 4 000 others, one every 30 ms, over the two
// windows after it, leave at most twice the heap of a Bucket that only
// saw the 4 000 (the 2 000 of the last window are live in both).
func TestLocalMemoryAfterChurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := []Option{PerResource(Per(10_000_000, time.Minute)), PerClient(Per(1, time.Minute))}
		fresh := heapOf(t, rules, func(*Bucket) { time.Sleep(time.Minute) })
		churned := heapOf(t, rules, func(b *Bucket) {
			const clients, steps = 100_000, 100
			for i := range clients {
				if i%(clients/steps) == 0 {
					time.Sleep(time.Minute / steps)
				}
				allow(t, b, "churn"+strconv.Itoa(i))
			}
		})
		t.Logf("heap of a Bucket after the churn: %d kB; without it: %d kB", churned/1000, fresh/1000)
		if churned > 2*fresh {
			t.Errorf("after the churn a Bucket holds %d kB, %.1fx the %d kB of its live keys, want at most 2x", churned/1000, float64(churned)/float64(fresh), fresh/1000)
		}
	})
}

// heapOf returns the heap held by a local Bucket of rules after before,
// then 4 000 distinct clients of resource "r" one every 30 ms: the heap
// live while the Bucket is, less the heap live once it is gone. Both are
// read within milliseconds of each other, so what the other tests'
// goroutines allocate or free over the seconds the calls take is not
// counted (a delta from before NewLocal once counted it, twice the
// Bucket's size on a loaded machine). A local Bucket starts no goroutine:
// once the test drops it, nothing holds it.
func heapOf(t *testing.T, rules []Option, before func(*Bucket)) uint64 {
	t.Helper()
	b, err := NewLocal(rules...)
	if err != nil {
		t.Fatal(err)
	}
	before(b)
	for i := range 4000 {
		time.Sleep(30 * ms)
		allow(t, b, "steady"+strconv.Itoa(i))
	}
	held := heapAlloc()
	runtime.KeepAlive(b)
	gone := heapAlloc()
	if gone >= held {
		t.Fatalf("the heap did not shrink when the Bucket was dropped (%d B, then %d B): the measurement failed", held, gone)
	}
	return held - gone
}

// allow makes a call that must be admitted.
func allow(t *testing.T, b *Bucket, client string) {
	t.Helper()
	if res, err := b.Allow(context.Background(), "r", client); err != nil || !res.Allowed {
		t.Fatalf("%s: %+v, %v", client, res, err)
	}
}

// heapAlloc returns the bytes of the objects live on the heap.
func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
