//go:build linux

package leakybucket

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/stall"
)

// The cost of an outage to the callers of one process, measured as a user
// meets it: a client of go-redis's default options (5 dial attempts 100 ms
// apart, 3 command retries), Redis killed, calls with 500 ms deadlines.
const (
	outageClients  = 10 // called in turn, each on a line (and a lock) of its own
	outageCalls    = 20 // per client
	outageDeadline = 500 * time.Millisecond
	outageP99      = 20 * time.Millisecond
	outageRecovery = time.Second
)

// TestOutageCostsOneCall: with Redis killed, under every strategy, through
// a Bucket and through Tiers (whose tiers' Buckets share what they learn
// of a server), ten clients in turn make 20 calls each: after the first
// failed call of the process, the p99 of the calls' time is at most 20 ms,
// every later error matches ErrUnavailable and keeps its
// network cause, and a call is admitted within 1 s of a restart.
//
// The time that counts is the library's: each call's wall time less the
// lateness of the scheduler measured while it ran (a 1 ms sleep beside it,
// woken late by a loaded machine), so that a CPU hog beside the test
// cannot fail it, while a call that waits for go-redis's dial retries
// (100 ms and more) still does.
func TestOutageCostsOneCall(t *testing.T) {
	paths := []struct {
		name string
		make func(t *testing.T, rdb *redis.Client, s Strategy) func(ctx context.Context, client int) (Result, error)
	}{
		{"bucket", outageBucket},
		{"tiers", outageTiers},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			eachFaultStrategy(t, strategies, func(t *testing.T, s Strategy, srv *redisProc) {
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
				t.Cleanup(func() { _ = rdb.Close() })
				allow := p.make(t, rdb, s)
				if res, err := allow(context.Background(), 0); err != nil || !res.Allowed {
					t.Fatalf("before the kill: %+v, %v", res, err)
				}
				srv.Kill()
				calls := outageRun(allow)
				checkOutage(t, calls)
				srv.Restart()
				checkBack(t, allow)
			})
		})
	}
}

func outageBucket(t *testing.T, rdb *redis.Client, s Strategy) func(context.Context, int) (Result, error) {
	b := faultBucket(t, rdb, WithStrategy(s), PerClient(Per(1_000_000, time.Minute)))
	return func(ctx context.Context, c int) (Result, error) { return b.Allow(ctx, "r", fmt.Sprint("c", c)) }
}

func outageTiers(t *testing.T, rdb *redis.Client, s Strategy) func(context.Context, int) (Result, error) {
	tiers, err := NewTiers(rdb, WithPrefix("fault"), WithStrategy(s))
	if err != nil {
		t.Fatal(err)
	}
	for _, tier := range []string{"free", "pro"} {
		if err := tiers.Set(tier, PerClient(Per(1_000_000, time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	return func(ctx context.Context, c int) (Result, error) {
		return tiers.Allow(ctx, []string{"free", "pro"}[c%2], "r", fmt.Sprint("c", c))
	}
}

// outageCall is one call of the outage: how long it took, the scheduler's
// stall meanwhile, and what it returned.
type outageCall struct {
	took, stalled time.Duration
	err           error
}

// outageRun makes the outage's calls, each client's in turn, beside a
// stall meter.
func outageRun(allow func(context.Context, int) (Result, error)) []outageCall {
	meter := stall.Start()
	type span struct{ start, end time.Time }
	var calls []outageCall
	var spans []span
	for c := range outageClients {
		for range outageCalls {
			ctx, cancel := context.WithTimeout(context.Background(), outageDeadline)
			start := time.Now()
			_, err := allow(ctx, c)
			end := time.Now()
			cancel()
			calls = append(calls, outageCall{took: end.Sub(start), err: err})
			spans = append(spans, span{start, end})
		}
	}
	meter.Close()
	for i, s := range spans {
		calls[i].stalled = meter.During(s.start, s.end)
	}
	return calls
}

// checkOutage checks the calls of an outage: every error ErrUnavailable
// with its cause, and the p99 of the library's time for the calls after
// the first failed one.
func checkOutage(t *testing.T, calls []outageCall) {
	t.Helper()
	first := -1
	for i, c := range calls {
		if c.err == nil {
			continue
		}
		if first < 0 {
			first = i // it may have spent its deadline, and say only that
			continue
		}
		if !unavailableWithCause(c.err) {
			t.Errorf("call %d: %v, want ErrUnavailable with its network cause", i, c.err)
		}
	}
	if first < 0 {
		t.Fatal("no call failed while Redis was down")
	}
	t.Logf("the first failed call (%d) took %v: %v", first, calls[first].took, calls[first].err)
	var own []time.Duration
	var stalled time.Duration
	for _, c := range calls[first+1:] {
		own = append(own, max(c.took-c.stalled, 0))
		stalled = max(stalled, c.stalled)
	}
	slices.Sort(own)
	p99 := own[len(own)*99/100]
	t.Logf("p99 of the later calls %v, slowest %v (less the scheduler's stalls, up to %v)", p99, own[len(own)-1], stalled)
	if p99 > outageP99 {
		t.Errorf("p99 of the %d calls after the first failed one = %v, want at most %v", len(own), p99, outageP99)
	}
}

// checkBack checks that a call is admitted within a second of the restart.
func checkBack(t *testing.T, allow func(context.Context, int) (Result, error)) {
	t.Helper()
	start := time.Now()
	var last error
	for time.Since(start) < 5*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		res, err := allow(ctx, 0)
		cancel()
		if err == nil && res.Allowed {
			if took := time.Since(start); took > outageRecovery {
				t.Errorf("admitted %v after the restart, want within %v", took, outageRecovery)
			}
			return
		}
		last = err
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("not admitted within 5s of the restart: %v", last)
}
