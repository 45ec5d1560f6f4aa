package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// atMostStrategies are every strategy AllowAtMost is tested under:
// the sliding ones of the suite, FixedWindows and GCRA.
var atMostStrategies = []Strategy{Logs, SortedSet, Windows(time.Millisecond), FixedWindows, GCRA}

// runAtMost runs steps with AllowAtMost (each step's n is AllowAtMost's),
// checking each Result as run does, and its Admitted against admitted,
// by step.
func (e *env) runAtMost(t *testing.T, b *Bucket, resource string, steps []step, admitted []int) {
	t.Helper()
	i := 0
	e.runWith(t, b, steps, func(s step) (Result, error) {
		res, err := b.AllowAtMost(context.Background(), resource, s.client, s.n)
		if err == nil && res.Admitted != admitted[i] {
			t.Errorf("step %d: AllowAtMost(%q, n=%d).Admitted = %d, want %d", i, s.client, s.n, res.Admitted, admitted[i])
		}
		i++
		return res, err
	})
}

// Fits all, fits part, fits none, under a per-resource rule and a
// per-client one: the rule with the least room decides how much, the
// same weight counts under both, and a denial is AllowN's of weight 1.
func TestAllowAtMostHierarchy(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		total, each := Per(10, time.Second), Per(4, time.Second)
		b := e.bucket(t, PerResource(total), PerClient(each))
		byClient := []Rule{{PerClient: true, Limit: each}}
		byTotal := []Rule{{Limit: total}}
		e.runAtMost(t, b, "r", []step{
			{0, "a", 3, false, want{true, 1, 0, time.Second, nil}},                 // fits all
			{0, "a", 3, false, want{true, 0, 0, time.Second, nil}},                 // a's own rule: 1 of 3
			{0, "a", 1, false, want{false, 0, time.Second, time.Second, byClient}}, // none
			{0, "b", 10, false, want{true, 0, 0, time.Second, nil}},                // b's rule (4) before the total's 6
			{0, "c", 4, false, want{true, 0, 0, time.Second, nil}},                 // the total's 2 before c's 4
			{0, "d", 2, false, want{false, 0, time.Second, time.Second, byTotal}},
			{500 * ms, "d", 1, false, want{false, 0, 500 * ms, 500 * ms, byTotal}},
			// t=1000: every call has left; n above every Requests admits
			// the least of them.
			{500 * ms, "d", 100, false, want{true, 0, 0, time.Second, nil}},
			{0, "e", 100, false, want{true, 0, 0, time.Second, nil}},
		}, []int{3, 1, 0, 4, 2, 0, 0, 4, 4})
		// What was admitted is what the rules count: the part of a
		// partial grant that did not fit was taken back.
		if u := usage(t, b, "r", "e"); u[0].Used != 8 || u[1].Used != 4 {
			t.Errorf("Usage(e) = %+v, want the total at 8 and e at 4", u)
		}
	})
}

func usage(t *testing.T, b *Bucket, resource, client string) []RuleResult {
	t.Helper()
	u, err := b.Usage(context.Background(), resource, client)
	if err != nil {
		t.Fatalf("Usage: %v", err)
	}
	return u
}

// go-redis/redis_rate v10's TestAllowAtMost, with its inputs and expected
// Allowed (here Admitted) and Remaining: PerSecond(10), burst 10, under
// GCRA with redis_rate's durations (its 99ms and 999ms are our 100ms and
// 1s, exact to the millisecond), and under the other strategies with a
// window's. Its AllowN(0) and AllowAtMost(0), which redis_rate answers as
// a peek, are bad input here (PeekN is the peek): see
// TestAllowAtMostBadInput.
func TestAllowAtMostRedisRate(t *testing.T) {
	admitted := []int{1, 2, 7, 0}
	t.Run("gcra", func(t *testing.T) {
		eachOf(t, []Strategy{GCRA}, func(t *testing.T, e *env) {
			b := e.bucket(t, PerResource(PerSecond(10)))
			deny := []Rule{{Limit: PerSecond(10)}}
			e.runAtMost(t, b, "test_id", []step{
				{0, "c", 1, false, want{true, 9, 0, 100 * ms, nil}},
				{0, "c", 2, false, want{true, 7, 0, 300 * ms, nil}},
				{0, "c", 10, false, want{true, 0, 0, time.Second, nil}},
				{0, "c", 1000, false, want{false, 0, 100 * ms, time.Second, deny}},
			}, admitted)
		})
	})
	t.Run("windows", func(t *testing.T) {
		each(t, func(t *testing.T, e *env) {
			b := e.bucket(t, PerResource(PerSecond(10)))
			deny := []Rule{{Limit: PerSecond(10)}}
			e.runAtMost(t, b, "test_id", []step{
				{0, "c", 1, false, want{true, 9, 0, time.Second, nil}},
				{0, "c", 2, false, want{true, 7, 0, time.Second, nil}},
				{0, "c", 10, false, want{true, 0, 0, time.Second, nil}},
				{0, "c", 1000, false, want{false, 0, time.Second, time.Second, deny}},
			}, admitted)
		})
	})
}

// FixedWindows and GCRA, whose durations differ from a sliding window's:
// the counts of fits all, part and none on fake time, on miniredis and in
// process, two rules at once.
func TestAllowAtMostCounts(t *testing.T) {
	for _, s := range []Strategy{FixedWindows, GCRA} {
		t.Run(s.String(), func(t *testing.T) {
			onFake(t, s, func(t *testing.T, e *env) {
				b := e.bucket(t, PerResource(Per(10, time.Minute)), PerClient(Per(4, time.Minute)))
				for i, c := range []struct {
					client          string
					n, admitted     int
					remaining, deny int
				}{
					{"a", 3, 3, 1, 0}, {"a", 3, 1, 0, 0}, {"a", 1, 0, 0, 1},
					{"b", 10, 4, 0, 0}, {"c", 4, 2, 0, 0}, {"d", 2, 0, 0, 1},
				} {
					res, err := b.AllowAtMost(context.Background(), "r", c.client, c.n)
					if err != nil || res.Admitted != c.admitted || res.Allowed != (c.admitted > 0) ||
						res.Remaining != c.remaining || len(res.DeniedBy) != c.deny {
						t.Errorf("step %d: AllowAtMost(%q, %d) = %+v, %v; want Admitted %d, Remaining %d, %d rules denying",
							i, c.client, c.n, res, err, c.admitted, c.remaining, c.deny)
					}
				}
			})
		})
	}
}

// Bad input is an error, as AllowN's, and writes nothing; so is a Bucket
// that records denied calls.
func TestAllowAtMostBadInput(t *testing.T) {
	for _, s := range atMostStrategies {
		t.Run(s.String(), func(t *testing.T) {
			onFake(t, s, func(t *testing.T, e *env) {
				ctx := context.Background()
				b := e.bucket(t, PerClient(Per(5, time.Second)))
				for _, c := range []struct {
					resource, client string
					n                int
					want             error
				}{
					{"r", "a", 0, ErrInvalidWeight}, {"r", "a", -1, ErrInvalidWeight},
					{"", "a", 1, ErrEmptyResource}, {"r", "", 1, ErrEmptyClient},
				} {
					res, err := b.AllowAtMost(ctx, c.resource, c.client, c.n)
					if !errors.Is(err, c.want) || res.Admitted != 0 || res.Rules != nil {
						t.Errorf("AllowAtMost(%q, %q, %d) = %+v, %v; want the zero Result and %v", c.resource, c.client, c.n, res, err, c.want)
					}
				}
				if keys := e.keys(t); len(keys) != 0 {
					t.Errorf("bad input wrote %v", keys)
				}
				if rd, err := e.new(WithStrategy(s), WithPrefix(e.prefix+"-rd"), PerClient(Per(5, time.Second)), WithRecordDenied()); err == nil {
					if _, err := rd.AllowAtMost(ctx, "r", "a", 1); !errors.Is(err, ErrInvalidOption) {
						t.Errorf("WithRecordDenied: AllowAtMost = %v, want ErrInvalidOption", err)
					}
				}
			})
		})
	}
}

// Exactness: four Buckets, each with a client of its own (four
// processes), of 25 goroutines each (a hundred on the real Redis) ask for
// 1 to 10 at a time on one key until denied, under a per-resource rule and
// a per-client one whose windows outlast the test. No rule ever counts
// more than its Requests (Rule 1), the counts are what the Results
// admitted, and at least 90% of the most possible is admitted.
func TestAllowAtMostExact(t *testing.T) {
	t.Parallel()
	// A day's windows: nothing leaves them, nor drains from GCRA's
	// buckets, while the test runs.
	for _, s := range []Strategy{Logs, SortedSet, Windows(time.Second), FixedWindows, GCRA} {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("miniredis", func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { atMostRace(t, newMiniEnv(t, s), 25) })
			})
			t.Run("local", func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { atMostRace(t, newLocalEnv(s), 25) })
			})
			t.Run("redis", func(t *testing.T) {
				atMostRace(t, newRealEnv(t, s), 100)
			})
		})
	}
}

const (
	raceTotal, raceEach = 1000, 40 // the rules' Requests
	raceClients         = 40       // room for 1600 in the clients' rules: the total's 1000 binds
	raceProcs           = 4
)

func atMostRace(t *testing.T, e *env, goroutines int) {
	day := 24 * time.Hour
	rules := []Option{PerResource(Per(raceTotal, day)), PerClient(Per(raceEach, day))}
	procs := make([]*Bucket, raceProcs)
	for p := range procs {
		if e.real && p > 0 {
			procs[p] = e.bucketOn(t, e.otherClient(t), rules...)
		} else if e.local != nil && p > 0 {
			procs[p] = procs[0] // in process, one Bucket is the only counts
		} else {
			procs[p] = e.bucket(t, rules...)
		}
	}
	var total atomic.Int64
	byClient := make([]atomic.Int64, raceClients)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for p, b := range procs {
		for g := range goroutines {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(p), uint64(g)))
				for {
					c := r.IntN(raceClients)
					res, err := b.AllowAtMost(context.Background(), "r", fmt.Sprint("c", c), 1+r.IntN(10))
					if err != nil {
						failed.Add(1)
						return
					}
					if res.Admitted == 0 && !res.DeniedBy[0].PerClient {
						return // the total is full, or was as it read
					}
					total.Add(int64(res.Admitted))
					byClient[c].Add(int64(res.Admitted))
				}
			})
		}
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d calls failed", f)
	}
	got := total.Load()
	t.Logf("admitted %d of %d", got, raceTotal)
	if got > raceTotal {
		t.Errorf("Rule 1: admitted %d under a total of %d", got, raceTotal)
	}
	if got*100 < raceTotal*90 {
		t.Errorf("admitted %d, under 90%% of %d", got, raceTotal)
	}
	for c := range byClient {
		if n := byClient[c].Load(); n > raceEach {
			t.Errorf("Rule 1: client %d admitted %d under its %d", c, n, raceEach)
		}
	}
	// The counts hold what was admitted: every part taken back has been
	// (a take-back may ride on a later transaction: read after one more).
	time.Sleep(100 * ms)
	if u := usage(t, procs[0], "r", "c0"); int64(u[0].Used) != got {
		t.Errorf("the total counts %d, the Results admitted %d", u[0].Used, got)
	}
}

// atMostMaxWeight is the most a call of TestAllowAtMostProcesses asks for.
const atMostMaxWeight = 10

// TestAllowAtMostProcesses is TestContentionProcesses (case 4 of the
// contention suite) with AllowAtMost: 4 processes (children of this test,
// each with its own client) x 100 goroutines ask for 1 to 10 at a time on
// one key under PerClient(Per(100, 2s)), for procRun, on the real Redis and
// the real cluster, under every contention strategy. The same two checks
// on the admissions, each of the weight its Result admitted: no window
// holds more than 100 units surely counted in it, and at least 90% of the
// most possible is admitted. It loads the machine as case 4 does: it is
// skipped with -short.
func TestAllowAtMostProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("4 processes of 100 goroutines for seconds per strategy")
	}
	onServers(t, false, func(t *testing.T, e *env) { checkProcesses(t, e, true) })
}

// With Redis down, AllowAtMost is decided by the fallback, on the shares
// of the rules (10 a minute over 3 instances: 3): n above the share
// admits the share, as above a rule's Requests on Redis.
func TestAllowAtMostFallback(t *testing.T) {
	for _, s := range atMostStrategies {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sw := newOutageSwitch(t, true)
				b := fallbackNew(t, sw.client(t, redis.Options{}), WithStrategy(s), PerClient(Per(10, time.Minute)), WithFallback(3))
				ctx := context.Background()
				if res, err := b.AllowAtMost(ctx, "r", "c", 4); err != nil || res.Admitted != 4 || res.Fallback || res.Remaining != 6 {
					t.Fatalf("on Redis: %+v, %v; want 4 admitted by Redis, 6 left", res, err)
				}
				sw.Down()
				for i, want := range []int{3, 0} {
					res, err := b.AllowAtMost(ctx, "r", "c", 8)
					if err != nil || res.Admitted != want || res.Allowed != (want > 0) || !res.Fallback || res.Remaining != 0 {
						t.Errorf("step %d in process: %+v, %v; want %d admitted in process, none left", i, res, err, want)
					}
				}
			})
		})
	}
}
