package leakybucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

// A minimum spacing is Per(1, d): exact under every strategy of the suite.
func TestMinimumSpacing(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		spacing := Per(1, time.Second)
		b := e.bucket(t, PerClient(spacing))
		deny := []Rule{{PerClient: true, Limit: spacing}}
		e.run(t, b, "r", []step{
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "b", 1, false, want{true, 0, 0, time.Second, nil}},
			{600 * ms, "a", 1, false, want{false, 0, 400 * ms, 400 * ms, deny}},
			{400 * ms, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{500 * ms, "a", 1, false, want{false, 0, 500 * ms, 500 * ms, deny}},
			{0, "b", 1, false, want{true, 0, 0, time.Second, nil}},
		})
	})
}

// WithRecordDenied counts denied calls too, so a client who keeps trying
// stays denied until it pauses for a window.
func TestRecordDenied(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		limit := Per(2, time.Second)
		b := e.bucket(t, PerClient(limit), WithRecordDenied())
		deny := []Rule{{PerClient: true, Limit: limit}}
		e.run(t, b, "r", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			// Counted: a third call at 0 must leave before there is room.
			{0, "a", 1, false, want{false, 0, time.Second, time.Second, deny}},
			// t=500: three calls at 0 and this one; room once the three leave.
			{500 * ms, "a", 1, false, want{false, 0, 500 * ms, time.Second, deny}},
			// Peek answers as Allow would, and records nothing.
			{500 * ms, "a", 1, true, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{false, 0, time.Second, time.Second, deny}},
			// Other clients have counts of their own.
			{0, "b", 1, false, want{true, 1, 0, time.Second, nil}},
		})
		plain := e.bucket(t, WithPrefix(e.prefix+"-plain"), PerClient(limit))
		e.run(t, plain, "r", []step{
			{0, "a", 2, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{false, 0, time.Second, time.Second, deny}},
			{500 * ms, "a", 1, false, want{false, 0, 500 * ms, 500 * ms, deny}},
			// By default the denied calls were not counted.
			{500 * ms, "a", 2, false, want{true, 0, 0, time.Second, nil}},
		})
	})
}

// Windows counts a call at the end of its interval: on fake time, aligned
// to whole seconds, the step table shows each answer up to one precision
// later than under Logs.
func TestWindowsPrecision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Windows(100*ms))
		limit := Per(3, time.Second)
		b := e.bucket(t, PerClient(limit))
		deny := []Rule{{PerClient: true, Limit: limit}}
		e.run(t, b, "r", []step{
			// Counted at 99, the end of the interval [0, 100).
			{0, "a", 1, false, want{true, 2, 0, 1099 * ms, nil}},
			{0, "a", 1, false, want{true, 1, 0, 1099 * ms, nil}},
			{300 * ms, "a", 1, false, want{true, 0, 0, 1099 * ms, nil}},
			// Logs would say 500ms: the calls at 0 leave at 1099, not 1000.
			{200 * ms, "a", 1, false, want{false, 0, 599 * ms, 899 * ms, deny}},
			{500 * ms, "a", 1, false, want{false, 0, 99 * ms, 399 * ms, deny}},
			{99 * ms, "a", 1, false, want{true, 1, 0, 1000 * ms, nil}},
		})
		// A one-hour window at a precision of one minute: at most 61
		// intervals per hash however many calls, and its incarnation.
		hourly := e.bucket(t, WithPrefix("hourly"), WithStrategy(Windows(time.Minute)), PerResource(PerHour(10_000)))
		for range 120 {
			for range 20 {
				if _, err := hourly.Allow(context.Background(), "r", "a"); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Minute)
		}
		if n := e.admin.HLen(context.Background(), remoteOf(hourly).keysOf("r").Hash("")).Val(); n > 61+deadFieldsMost {
			t.Errorf("the resource's hash has %d fields, want at most 61 intervals and %d dead ones", n, deadFieldsMost)
		}
	})
}

// deadFieldsMost is the most intervals a Windows hash keeps beyond those
// of its window, as docs/design.md promises: the store deletes them once a
// decision reads 16.
const deadFieldsMost = 15

// A Windows hash used now and then, never idle long enough to expire,
// keeps at most deadFieldsMost intervals that left its window: they are deleted
// although no call lands just as they die.
func TestWindowsSparseCallsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Windows(ms))
		b := e.bucket(t, PerResource(Per(1000, 100*ms)))
		const every = 7 * ms
		live := int64(100*ms/every) + 1
		for i := range 300 {
			if _, err := b.Allow(context.Background(), "r", "a"); err != nil {
				t.Fatal(err)
			}
			if n := e.admin.HLen(context.Background(), remoteOf(b).keysOf("r").Hash("")).Val(); n > live+deadFieldsMost {
				t.Fatalf("after call %d the hash has %d fields, want at most %d live and %d dead", i, n, live, deadFieldsMost)
			}
			time.Sleep(every)
		}
	})
}

// The bound of Windows, as a property over random calls on fake time: it
// never admits a call that an exact sliding log of its own admitted calls
// would deny, and it admits every call that such a log would admit if each
// call stayed precision longer in the window.
func TestWindowsBound(t *testing.T) {
	for _, precision := range []time.Duration{7 * ms, 50 * ms, 250 * ms} {
		t.Run(precision.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newMiniEnv(t, Windows(precision))
				short, long := Per(5, 300*ms), Per(12, 1500*ms)
				b := e.bucket(t, PerResource(long), PerClient(short))
				type call struct {
					at     time.Time
					client string
					n      int
				}
				var admitted []call
				// used returns the weight admitted within window before now,
				// each call counted for window+extra.
				used := func(now time.Time, client string, window, extra time.Duration) int {
					sum := 0
					for _, c := range admitted {
						if (client == "" || c.client == client) && now.Sub(c.at) < window+extra {
							sum += c.n
						}
					}
					return sum
				}
				rng := rand.New(rand.NewPCG(1, uint64(precision)))
				for i := range 400 {
					time.Sleep(time.Duration(rng.IntN(60)) * ms)
					now, client, n := time.Now(), fmt.Sprint("c", rng.IntN(3)), 1+rng.IntN(3)
					res, err := b.AllowN(context.Background(), "r", client, n)
					if err != nil {
						t.Fatal(err)
					}
					exact := used(now, client, short.Window, 0)+n <= short.Requests && used(now, "", long.Window, 0)+n <= long.Requests
					late := used(now, client, short.Window, precision)+n <= short.Requests && used(now, "", long.Window, precision)+n <= long.Requests
					switch {
					case res.Allowed && !exact:
						t.Fatalf("call %d: admitted %d for %s, which an exact log denies", i, n, client)
					case !res.Allowed && late:
						t.Fatalf("call %d: denied %d for %s, which fits even with calls kept %v longer", i, n, client, precision)
					}
					if res.Allowed {
						admitted = append(admitted, call{now, client, n})
					}
				}
			})
		})
	}
}

// SortedSet and Windows read their own keys only: on a database where a
// Logs decision takes hundreds of SCAN pages, theirs still takes one round
// trip (a denial this Bucket foresaw writes nothing, so takes nothing
// back), and Peek one. (Real Redis only: miniredis ignores SCAN COUNT.)
func TestCostIndependentOfDatabaseSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range []Strategy{SortedSet, Windows(time.Second)} {
		e := newRealEnv(t, s)
		e.fillUnrelated(t, 3000)
		b := e.bucket(t, WithScanCount(10), PerResource(PerMinute(100)), PerClient(PerMinute(10)))
		if _, err := b.Peek(ctx, "r", "a"); err != nil { // the first estimate of Redis's clock
			t.Fatal(err)
		}
		for i := range 12 {
			var res Result
			var err error
			want := int64(1)
			if trips := e.trips.count(func() { res, err = b.Allow(ctx, "r", "a") }); trips != want || err != nil || res.Allowed != (i < 10) {
				t.Errorf("%v: Allow #%d = %+v, %v in %d round trips; want %d", s, i+1, res, err, trips, want)
			}
		}
		if trips := e.trips.count(func() { _, _ = b.Peek(ctx, "r", "b") }); trips != 1 {
			t.Errorf("%v: Peek took %d round trips, want 1", s, trips)
		}
	}
}

// A call of weight 1 that every rule, all per-client, denied is answered
// in-process until a rule has room again: with no round trip, and the
// Result Redis would give, its durations moved on; Flush forgets it.
func TestDenialCache(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "the denial cache saves round trips to Redis")
		ctx := context.Background()
		limit := Per(2, time.Minute)
		b := e.bucket(t, PerClient(limit), PerClient(Per(5, time.Hour)))
		deny := []Rule{{PerClient: true, Limit: limit}}
		e.run(t, b, "r", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Hour, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Hour, nil}},
			// Denied by the minute rule only: asked again, from Redis.
			{time.Second, "a", 1, false, want{false, 0, 59 * time.Second, 59*time.Minute + 59*time.Second, deny}},
		})
		if trips := e.trips.count(func() { _, _ = b.Allow(ctx, "r", "a") }); trips == 0 {
			t.Errorf("a call denied by one of two rules was answered from the cache")
		}
		// The cache counts time only once the server's clock was seen
		// moving: hence the second between the calls.
		full := e.bucket(t, WithPrefix(e.prefix+":full"), PerClient(limit))
		e.run(t, full, "r", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Minute, nil}},
			{time.Second, "a", 1, false, want{true, 0, 0, time.Minute, nil}},
			{0, "a", 1, false, want{false, 0, 59 * time.Second, time.Minute, []Rule{{PerClient: true, Limit: limit}}}},
		})
		var res Result
		if trips := e.trips.count(func() { res, _ = full.Allow(ctx, "r", "a") }); trips != 0 || res.Allowed || res.Rules[0].Used != 2 {
			t.Errorf("a call every rule denied: %+v in %d round trips, want denied from the cache", res, trips)
		}
		if err := full.Flush(ctx, "r", "a"); err != nil {
			t.Fatal(err)
		}
		if res, err := full.Allow(ctx, "r", "a"); err != nil || !res.Allowed {
			t.Errorf("after Flush: %+v, %v; want admitted (the cached denial forgotten)", res, err)
		}
	})
}
