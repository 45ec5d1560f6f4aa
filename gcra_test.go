package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// eachGCRA runs test under GCRA on miniredis and in process on fake time,
// on the real Redis and on the real cluster.
func eachGCRA(t *testing.T, test func(t *testing.T, e *env)) {
	t.Helper()
	eachOf(t, []Strategy{GCRA}, test)
}

// onFakeTime runs test under GCRA on miniredis and in process, in a
// synctest bubble: for cases whose numbers hold only where no time passes
// unseen.
func onFakeTime(t *testing.T, test func(t *testing.T, e *env)) {
	t.Helper()
	onFake(t, GCRA, test)
}

// The cases of go-redis/redis_rate v10's rate_test.go (TestAllow), with
// its inputs and expected numbers: PerSecond(10), whose burst is 10. Two
// differ by design: a weight above the burst is denied with RetryAfter
// Never (redis_rate says 99s, a wait after which it is denied again), and
// an allowed call's RetryAfter is 0 (redis_rate's is -1).
func TestGCRARedisRateAllow(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(PerSecond(10)))
		deny := []Rule{{Limit: PerSecond(10)}}
		e.run(t, b, "test_id", []step{
			{0, "c", 1, false, want{true, 9, 0, 100 * ms, nil}},
		})
		if err := b.FlushAll(context.Background(), "test_id"); err != nil {
			t.Fatal(err)
		}
		e.clock.recorded = nil
		e.run(t, b, "test_id", []step{
			{0, "c", 1, false, want{true, 9, 0, 100 * ms, nil}},
			{0, "c", 2, false, want{true, 7, 0, 300 * ms, nil}},
			{0, "c", 7, false, want{true, 0, 0, time.Second, nil}},
			{0, "c", 1000, false, want{false, 0, Never, time.Second, deny}},
		})
	})
}

// redis_rate's TestRetryAfter: a rate of 1 per ms, burst 1; a denied
// call's RetryAfter is at most 1ms.
func TestGCRARedisRateRetryAfter(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(Per(1, time.Millisecond)))
		for i := range 1000 {
			res, err := b.Allow(context.Background(), "test_id", "c")
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed && res.RetryAfter > time.Millisecond {
				t.Fatalf("call %d: RetryAfter = %v, want at most 1ms", i, res.RetryAfter)
			}
		}
	})
}

// xallow is a step of x/time/rate's rate_test.go: at t (in steps of
// 100ms), the tokens before the call, its weight, and whether AllowN
// admits it.
type xallow struct {
	t    int
	toks int
	n    int
	ok   bool
}

// runXTime runs x/time/rate's steps on a Bucket of NewLimiter(10, burst):
// Remaining is the tokens left after an admitted call, and before a
// denied one.
func runXTime(t *testing.T, e *env, burst int, steps []xallow) {
	t.Helper()
	b := e.bucket(t, PerResource(Per(10, time.Second).WithBurst(burst)))
	start := time.Now()
	for i, s := range steps {
		time.Sleep(time.Until(start.Add(time.Duration(s.t) * 100 * ms)))
		res, err := b.AllowN(context.Background(), "r", "c", s.n)
		if err != nil {
			t.Fatal(err)
		}
		left := s.toks
		if s.ok {
			left -= s.n
		}
		if res.Allowed != s.ok || res.Remaining != left {
			t.Errorf("step %d: AllowN(n=%d) at t%d = {Allowed:%v Remaining:%d}, want {%v %d}", i, s.n, s.t, res.Allowed, res.Remaining, s.ok, left)
		}
	}
}

// x/time/rate's TestLimiterBurst1 and TestLimiterBurst3 (its inputs and
// expected results; its last step, of weight 0, is not a call here).
func TestGCRATimeRateBurst(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		runXTime(t, e, 1, []xallow{
			{0, 1, 1, true}, {0, 0, 1, false}, {0, 0, 1, false},
			{1, 1, 1, true}, {1, 0, 1, false}, {1, 0, 1, false},
			{2, 1, 2, false}, // burst size is 1, so n=2 always fails
			{2, 1, 1, true}, {2, 0, 1, false},
		})
	})
	onFakeTime(t, func(t *testing.T, e *env) {
		runXTime(t, e, 3, []xallow{
			{0, 3, 2, true}, {0, 1, 2, false}, {0, 1, 1, true}, {0, 0, 1, false},
			{1, 1, 4, false},
			{2, 2, 1, true}, {3, 2, 1, true},
			{4, 2, 1, true}, {4, 1, 1, true}, {4, 0, 1, false}, {4, 0, 1, false},
			{9, 3, 3, true},
		})
	})
}

// A call is admitted only if every rule's bucket has room, and then fills
// every one; a denied call fills none. Per(4, time.Second) drains one
// every 250ms.
func TestGCRAAllOrNothing(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		total, each := Per(4, time.Second), Per(2, time.Second)
		b := e.bucket(t, PerResource(total), PerClient(each))
		byClient, byTotal := []Rule{{PerClient: true, Limit: each}}, []Rule{{Limit: total}}
		e.run(t, b, "notify", []step{
			{0, "a", 1, false, want{true, 1, 0, 500 * ms, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			// a's bucket is full until 500ms have drained one.
			{0, "a", 1, false, want{false, 0, 500 * ms, time.Second, byClient}},
			{0, "b", 1, false, want{true, 1, 0, 750 * ms, nil}},
			// The denied call of a filled nothing: one is left in the total.
			{0, "c", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "c", 1, false, want{false, 0, 250 * ms, time.Second, byTotal}},
			{250 * ms, "c", 1, false, want{true, 0, 0, time.Second, nil}},
		})
	})
}

// A burst above the rate: Per(10, time.Second).WithBurst(50) admits 50
// at once, then one every 100ms.
func TestGCRABurst(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		l := Per(10, time.Second).WithBurst(50)
		b := e.bucket(t, PerClient(l))
		deny := []Rule{{PerClient: true, Limit: l}}
		e.run(t, b, "r", []step{
			{0, "a", 49, false, want{true, 1, 0, 4900 * ms, nil}},
			{0, "a", 2, false, want{false, 1, 100 * ms, 4900 * ms, deny}},
			{0, "a", 1, false, want{true, 0, 0, 5 * time.Second, nil}},
			{0, "a", 51, false, want{false, 0, Never, 5 * time.Second, deny}},
			{200 * ms, "a", 2, true, want{true, 0, 0, 5 * time.Second, nil}},
		})
	})
}

// GCRA refuses what means nothing to it, and the others refuse a burst.
func TestGCRARefusesOptions(t *testing.T) {
	rule := PerClient(PerSecond(10))
	for name, opts := range map[string][]Option{
		"record denied": {WithStrategy(GCRA), rule, WithRecordDenied()},
		"lock ttl":      {WithStrategy(GCRA), rule, WithLockTTL(time.Second)},
		"lock wait":     {WithStrategy(GCRA), rule, WithLockWait(time.Millisecond, time.Second)},
		"replicas":      {WithStrategy(GCRA), rule, WithReplicas(1, time.Second)},
		"precision":     {WithStrategy(GCRA), PerClient(PerSecond(10).WithPrecision(time.Millisecond))},
		"sorted set":    {WithStrategy(SortedSet), PerClient(PerSecond(10).WithBurst(20))},
		"negative":      {WithStrategy(GCRA), PerClient(PerSecond(10).WithBurst(-1))},
		"span":          {WithStrategy(GCRA), PerClient(Per(1, time.Hour).WithBurst(1 << 40))},
	} {
		if _, err := NewLocal(opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: NewLocal: %v, want ErrInvalidOption", name, err)
		}
	}
}

// The stall test: a lag of 0.5 to 40ms between a decision's read and its
// write, from 20 goroutines, on a burst-1 rule: no two admissions run
// closer than its interval in Redis's time. On miniredis in a synctest
// bubble, Redis's time is the fake clock when the EXEC is sent; on the
// real Redis, on this host, an EXEC ran between its send and its reply.
func TestGCRAStall(t *testing.T) {
	const interval = 20 * ms
	run := func(t *testing.T, e *env, calls int) {
		lag := &execLag{}
		e.addHook(lag)
		b := e.bucket(t, PerResource(Per(1, interval)))
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				for range calls {
					if _, err := b.Allow(context.Background(), "r", "c"); err != nil {
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(rand.IntN(10)) * ms)
				}
			})
		}
		wg.Wait()
		lag.check(t, interval)
	}
	t.Run("miniredis", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { run(t, newMiniEnv(t, GCRA), 50) })
	})
	t.Run("redis", func(t *testing.T) { run(t, newRealEnv(t, GCRA), 20) })
}

// execLag delays every EXEC by 0.5 to 40ms before it is sent, and keeps
// when each that applied was sent and answered.
type execLag struct {
	mu      sync.Mutex
	applied [][2]time.Time
}

func (h *execLag) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *execLag) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *execLag) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		last := cmds[len(cmds)-1]
		if last.Name() != "exec" {
			return next(ctx, cmds)
		}
		time.Sleep(500*time.Microsecond + time.Duration(rand.Int64N(int64(40*ms))))
		sent := time.Now()
		err := next(ctx, cmds)
		if last.Err() == nil {
			h.mu.Lock()
			h.applied = append(h.applied, [2]time.Time{sent, time.Now()})
			h.mu.Unlock()
		}
		return err
	}
}

// check fails if two applied EXECs surely ran closer than interval.
func (h *execLag) check(t *testing.T, interval time.Duration) {
	t.Helper()
	slices.SortFunc(h.applied, func(a, b [2]time.Time) int { return a[0].Compare(b[0]) })
	for i := 1; i < len(h.applied); i++ {
		if gap := h.applied[i][1].Sub(h.applied[i-1][0]); gap < interval {
			t.Errorf("admissions %d and %d ran within %v, interval %v", i-1, i, gap, interval)
		}
	}
	if len(h.applied) < 2 {
		t.Errorf("%d admissions", len(h.applied))
	}
}

// Peek writes nothing; Flush empties a client's own buckets, FlushAll
// every bucket of the resource; WaitN waits exactly until the call fits.
func TestGCRAPeekFlushWait(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(Per(10, time.Second)), PerClient(Per(2, time.Second)))
		for range 3 {
			if res, err := b.Peek(ctx, "r", "a"); err != nil || !res.Allowed || res.Remaining != 1 {
				t.Fatalf("Peek = %+v, %v; want allowed, 1 remaining", res, err)
			}
		}
		allow := func(want ...bool) { t.Helper(); allowEach(t, b, "a", want...) }
		allow(true, true, false)
		must(t, b.Flush(ctx, "r", "a"))
		allow(true, true)
		must(t, b.FlushAll(ctx, "r"))
		if keys := e.countKeys(t); len(keys) != 0 {
			t.Errorf("after FlushAll: %q", keys)
		}
		allow(true, true)
		start := time.Now()
		must(t, b.Wait(ctx, "r", "a"))
		// a's bucket drains one every 500ms; Wait adds a jitter of up to a
		// tenth. On a real clock, a loaded machine may make it longer.
		if waited := time.Since(start); !e.real && (waited < 500*ms || waited > 550*ms) {
			t.Errorf("Wait waited %v, want 500ms to 550ms", waited)
		}
	})
}

// allowEach makes one Allow of client at "r" per want, each of which
// must be Allowed as want says.
func allowEach(t *testing.T, b *Bucket, client string, want ...bool) {
	t.Helper()
	for _, w := range want {
		if res, err := b.Allow(context.Background(), "r", client); err != nil || res.Allowed != w {
			t.Fatalf("Allow(%s) = %+v, %v; want Allowed %v", client, res, err, w)
		}
	}
}

// must fails the test on an error.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Flush of a Bucket whose rules are all per-resource has no client's
// bucket to empty.
func TestGCRAFlushWithoutClientRule(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(PerSecond(10)))
		if err := b.Flush(context.Background(), "r", "a"); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("Flush = %v, want errors.ErrUnsupported", err)
		}
	})
}

// Each method sends only the commands listed for GCRA, and on miniredis,
// whose fake time makes every path certain, all of them.
func TestGCRACommandsPerMethod(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "commands")
		ctx := context.Background()
		_, cluster := e.rdb.(*redis.ClusterClient)
		sent := map[method][]string{}
		record := func(m method, f func() error) {
			t.Helper()
			var err error
			cmds := e.sent.during(func() { err = f() })
			if err != nil {
				t.Fatalf("%s: %v", m, err)
			}
			for _, c := range cmds {
				if !slices.Contains(methodCommands("gcra", m, cluster), c) {
					t.Errorf("%s sent %s, which is not listed for it", m, c)
				}
			}
			sent[m] = unique(append(sent[m], cmds...))
		}
		b := e.bucket(t, PerResource(PerSecond(10)), PerClient(PerSecond(1)))
		record(peekMethod, func() error { _, err := b.Peek(ctx, "r", "a"); return err })
		for range 2 {
			record(allowMethod, func() error { _, err := b.Allow(ctx, "r", "a"); return err })
		}
		record(allowMethod, func() error { _, err := b.Allow(ctx, "r", "b"); return err })
		record(flushMethod, func() error { return b.Flush(ctx, "r", "a") })
		record(flushAllMethod, func() error { return b.FlushAll(ctx, "r") })
		if e.mini == nil {
			return
		}
		for _, m := range methods {
			for _, c := range methodCommands("gcra", m, false) {
				if !slices.Contains(sent[m], c) {
					t.Errorf("%s never sent %s, which is listed for it", m, c)
				}
			}
		}
	})
}

// WithFallback under GCRA: once Redis is down, the breaker opens and the
// calls are decided in process by the rule's share, its rate and burst
// divided by the instances; once Redis is back, on Redis again.
func TestGCRAFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sw := newOutageSwitch(t, true)
		limit := Per(10, time.Minute).WithBurst(30)
		b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(GCRA), PerClient(limit), WithFallback(3))
		allow := func(what string, want Result) {
			t.Helper()
			res, err := b.Allow(context.Background(), "r", "c")
			if err != nil || res.Allowed != want.Allowed || res.Fallback != want.Fallback || res.Remaining != want.Remaining || res.RetryAfter != want.RetryAfter {
				t.Fatalf("%s: %+v, %v; want %+v", what, res, err, want)
			}
		}
		allow("on Redis", Result{Allowed: true, Remaining: 29})
		sw.Down()
		// The share: 3 a minute, a burst of 10.
		for i := range 10 {
			allow(fmt.Sprintf("call %d in process", i), Result{Allowed: true, Fallback: true, Remaining: 9 - i})
		}
		allow("the 11th in process, a 20s drain away", Result{Fallback: true, RetryAfter: 20 * time.Second})
		sw.Up()
		time.Sleep(time.Second)
		allow("back on Redis", Result{Allowed: true, Remaining: 28})
	})
}

// What a bucket costs Redis, with the names of the bench's memory table
// (prefix "lb", a resource of 6 characters, "client-123", 3 calls under
// PerClient(Per(10, 10*time.Second))): at most 1.1x redis_rate's 104 B
// (MEMORY USAGE, Redis 7.0.15), its one string per client.
func TestGCRAMemoryPerClient(t *testing.T) {
	admin := realAdmin(t)
	ctx := context.Background()
	resource := "m" + strconv.Itoa(100000 + rand.IntN(900000))[1:]
	b, err := New(admin, WithStrategy(GCRA), WithPrefix("lb"), PerClient(Per(10, 10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.FlushAll(ctx, resource)
	for range 3 {
		if _, err := b.Allow(ctx, resource, "client-123"); err != nil {
			t.Fatal(err)
		}
	}
	found, _, err := admin.Scan(ctx, 0, "lb:g:{"+keys.Encode(resource)+"}:*", 1000).Result()
	if err != nil || len(found) != 1 {
		t.Fatalf("keys %q, %v; want one", found, err)
	}
	usage, err := admin.MemoryUsage(ctx, found[0]).Result()
	t.Logf("%s: MEMORY USAGE %d B", found[0], usage)
	if err != nil || usage > 114 {
		t.Errorf("MEMORY USAGE = %d, %v; want at most 114 B (1.1x redis_rate's 104 B)", usage, err)
	}
}

// An uncontended decision costs two round trips: the read under WATCH,
// then the EXEC, or the UNWATCH of a batch that writes nothing.
func TestGCRARoundTrips(t *testing.T) {
	eachGCRA(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "round trips")
		b := e.bucket(t, PerClient(PerSecond(1)))
		const calls = 50
		for _, admitted := range []bool{true, false} {
			n := e.trips.count(func() {
				for i := range calls {
					allowEach(t, b, "c"+strconv.Itoa(i), admitted)
				}
			})
			if n != 2*calls {
				t.Errorf("%d calls (admitted %v): %d round trips, want %d", calls, admitted, n, 2*calls)
			}
		}
	})
}

// In process, an admitted GCRA decision into a Result allocates nothing.
func TestGCRALocalAllocatesNothing(t *testing.T) {
	b, err := NewLocal(WithStrategy(GCRA), PerResource(Per(1_000_000, time.Hour)), PerClient(Per(1_000_000, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	_ = b.AllowNInto(context.Background(), "r", "a", 1, &res)
	if n := testing.AllocsPerRun(1000, func() { _ = b.AllowNInto(context.Background(), "r", "a", 1, &res) }); n != 0 || !res.Allowed {
		t.Errorf("AllowNInto: %v allocations a decision, admitted %v; want 0, admitted", n, res.Allowed)
	}
}

// A rule whose interval is no whole number of ms drains at exactly its
// rate: from empty, its whole burst at once, the next call's RetryAfter
// the interval rounded up to the ms, and after a span d exactly d*rate
// more. With a TAT kept to the ms and each call's cost rounded up,
// Per(3, time.Second) admitted 2 of its burst of 3, and Per(10_000,
// time.Second) 1 003 of 10 000.
func TestGCRAFractionalIntervals(t *testing.T) {
	for _, c := range []struct {
		limit        Limit
		retry, after time.Duration // the RetryAfter of the first denial; a span
		more         int           // admitted after the span
	}{
		{Per(3, time.Second), 334 * ms, time.Second, 3},
		{Per(600, time.Second), 2 * ms, 10 * ms, 6},
		{Per(1_000_000, time.Hour).WithBurst(2000), 4 * ms, 36 * ms, 10},
		{Per(7, 2*time.Second).WithBurst(5), 286 * ms, 2 * time.Second, 5},
	} {
		t.Run(c.limit.String(), func(t *testing.T) {
			onFakeTime(t, func(t *testing.T, e *env) {
				b := e.bucket(t, PerClient(c.limit))
				burst := c.limit.Requests
				if c.limit.Burst > 0 {
					burst = c.limit.Burst
				}
				got, res := admitUntilDenied(t, b, burst)
				if got != burst || res.RetryAfter != c.retry {
					t.Errorf("from empty: %d admitted, then RetryAfter %v; want %d, %v", got, res.RetryAfter, burst, c.retry)
				}
				time.Sleep(c.after)
				if got, _ := admitUntilDenied(t, b, c.more); got != c.more {
					t.Errorf("%v later: %d admitted, want %d", c.after, got, c.more)
				}
			})
		})
	}
}

// A rule faster than one unit per ms has one bound in Redis (see
// docs/strategies.md): when a call costing less than a ms fills an empty
// bucket, the next decisions read its TAT rounded up to the ms, at most
// one ms of drain more than GCRA, 10 units at 10 000 a second. NewLocal keeps
// the TAT in process, with no such bound. Before TATs kept fractions, a
// burst of this rule admitted 1 003.
func TestGCRAFasterThanAMillisecond(t *testing.T) {
	onFakeTime(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(10_000, time.Second).WithBurst(1000)))
		least := 1000 - 9
		if e.local != nil {
			least = 1000
		}
		if got, _ := admitUntilDenied(t, b, 0); got < least || got > 1000 {
			t.Errorf("from empty: %d admitted, want %d to 1000", got, least)
		}
		time.Sleep(2 * ms)
		if got, _ := admitUntilDenied(t, b, 20); got != 20 {
			t.Errorf("2ms later: %d admitted, want 20", got)
		}
	})
}

// admitUntilDenied calls until a call is denied, at one instant of fake
// time, and returns how many were admitted and the denial; if full > 0,
// each admitted call's Remaining must be full less the calls so far.
func admitUntilDenied(t *testing.T, b *Bucket, full int) (int, Result) {
	t.Helper()
	for n := 0; ; n++ {
		res, err := b.Allow(context.Background(), "r", "c")
		if err != nil {
			t.Fatal(err)
		}
		if !res.Allowed {
			return n, res
		}
		if want := full - n - 1; full > 0 && res.Remaining != want {
			t.Fatalf("call %d: Remaining %d, want %d", n, res.Remaining, want)
		}
	}
}
