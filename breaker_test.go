//go:build linux

package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/stall"
)

// The breaker's numbers, on a real server that is killed and restarted.
const (
	breakerCalls    = 200
	breakerDeadline = 500 * time.Millisecond
	// breakerFirst calls may still be slow or carry a bare deadline: those
	// that went to Redis before anything knew it was gone.
	breakerFirst = 5
	// breakerP99 bounds the 99th percentile of the other calls, plus the
	// scheduler's lag measured meanwhile (see TestBreakerKill).
	breakerP99        = 10 * time.Millisecond
	breakerUnavail    = 0.95        // the share of calls that must be ErrUnavailable with the cause
	breakerRecovery   = time.Second // admitted again this soon after the restart
	breakerPerAttempt = 250 * time.Millisecond
)

// TestBreakerKill: with Redis killed and the client of the Quick start
// (go-redis's default options: 5 dial attempts 100 ms apart, 3 command
// retries), 200 sequential calls with 500 ms deadlines fail fast after the
// first few (p99 <= 10 ms), at least 95 % of them with ErrUnavailable and
// the network cause; a call is admitted again within 1 s of a restart on
// the same port. Wall-clock bounds flake under load, so the p99 bound
// grows by the worst lateness of a 1 ms sleep during the calls (what the
// scheduler alone costs on a loaded machine), and the first few calls,
// which wait for go-redis's retries, count only toward the 95 %.
func TestBreakerKill(t *testing.T) {
	eachFaultStrategy(t, strategies, func(t *testing.T, s Strategy, srv *redisProc) {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		b := faultBucket(t, rdb, WithStrategy(s), unlimited(time.Second))
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("Allow before the kill = %+v, %v", res, err)
		}
		srv.Kill()
		took, errs, lag := sequentialCalls(b, breakerCalls, breakerDeadline)
		checkFailFast(t, took, errs, lag)

		srv.Restart()
		recovery, ok, last := timeToAdmit(b, "r", "c", time.Now(), breakerPerAttempt, 5*time.Second)
		t.Logf("admitted %v after the restart (ok %v, last error %v)", recovery.Round(time.Millisecond), ok, last)
		if !ok || recovery > breakerRecovery {
			t.Errorf("after the restart a call waited %v for an admission (ok %v, last error %v), want at most %v",
				recovery.Round(time.Millisecond), ok, last, breakerRecovery)
		}
	})
}

// sequentialCalls makes n calls of b.Allow one after the other, each with
// its own deadline, and returns how long each took, their errors, and the
// worst lateness of a 1 ms sleep meanwhile.
func sequentialCalls(b *Bucket, n int, deadline time.Duration) (took []time.Duration, errs []error, lag time.Duration) {
	stats := newCallStats()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go stats.probeScheduler(stop, &wg)
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		start := time.Now()
		_, err := b.Allow(ctx, "r", "c")
		took = append(took, time.Since(start))
		errs = append(errs, err)
		cancel()
	}
	close(stop)
	wg.Wait()
	return took, errs, stats.allowedOverrun(0)
}

// checkFailFast checks the calls of a killed server against the breaker's
// numbers.
func checkFailFast(t *testing.T, took []time.Duration, errs []error, lag time.Duration) {
	t.Helper()
	later := slices.Sorted(slices.Values(took[breakerFirst:]))
	p99 := later[len(later)*99/100]
	unavailable, examples := 0, map[string]int{}
	for _, err := range errs {
		if unavailableWithCause(err) {
			unavailable++
		}
		examples[fmt.Sprint(err)]++
	}
	t.Logf("first calls took %v; p99 of the rest %v, slowest %v (scheduler lag up to %v); %d of %d ErrUnavailable with the cause",
		took[:breakerFirst], p99, later[len(later)-1], lag, unavailable, len(errs))
	if p99 > breakerP99+lag {
		t.Errorf("p99 of the calls after the first %d = %v, want at most %v (+%v of scheduler lag)", breakerFirst, p99, breakerP99, lag)
	}
	if float64(unavailable) < breakerUnavail*float64(len(errs)) {
		t.Errorf("%d of %d calls failed with ErrUnavailable and the network cause, want at least %.0f %%; errors: %v",
			unavailable, len(errs), 100*breakerUnavail, examples)
	}
}

// TestBreakerLateCall: a call whose context ends while go-redis dials a
// dead server comes back as ErrUnavailable with the cause once the breaker
// knows the server is down, not as a bare deadline; and WithoutBreaker
// leaves every call to go to Redis.
func TestBreakerLateCall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real server")
	}
	srv := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	b := faultBucket(t, rdb, unlimited(time.Second))
	off := faultBucket(t, rdb, unlimited(time.Second), WithoutBreaker())
	srv.Kill()
	ctx := context.Background()
	// Opened by a first call, whichever way it fails.
	allowWithin(ctx, b, 300*time.Millisecond)
	waitOpen(t, b)
	// A late error, as a call that gave up while go-redis dialed.
	late := remoteOf(b).finalError(ctx, "r", fmt.Errorf("leakybucket: %w while waiting for Redis", context.DeadlineExceeded))
	if !unavailableWithCause(late) || !errors.Is(late, context.DeadlineExceeded) || errors.Is(late, ErrLockNotObtained) {
		t.Errorf("a late call while the breaker is open = %v, want ErrUnavailable with the cause, and the deadline", late)
	}
	start := time.Now()
	if err := allowWithin(ctx, off, 50*time.Millisecond); breaker.Refused(err) || time.Since(start) < 40*time.Millisecond {
		t.Errorf("WithoutBreaker: a call returned %v after %v, want it to wait for go-redis until its deadline", err, time.Since(start))
	}
	srv.Restart()
	if _, ok, last := timeToAdmit(b, "r", "c", time.Now(), breakerPerAttempt, 5*time.Second); !ok {
		t.Errorf("not admitted after the restart: %v", last)
	}
}

// allowWithin makes one Allow of b with a deadline d from now.
func allowWithin(ctx context.Context, b *Bucket, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := b.Allow(ctx, "r", "c")
	return err
}

// waitOpen waits until b's breaker of its only server is open.
func waitOpen(t *testing.T, b *Bucket) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if remoteOf(b).breakers.AnyOpen() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the breaker did not open within 5s of the kill")
}

// TestBreakerKillOtherMethods: PeekN, Usage, Flush and FlushAll meet an
// outage as AllowN does. With Redis killed and the client of the Quick
// start, the first of them (on a Bucket that has not failed yet) returns
// ErrUnavailable with the cause soon after the probe's 10 ms, or 110 ms
// at worst (it waits no second for go-redis's dial retries), and the next
// ones at once.
func TestBreakerKillOtherMethods(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real server")
	}
	methods := map[string]func(ctx context.Context, b *Bucket) error{
		"peek":      func(ctx context.Context, b *Bucket) error { _, err := b.Peek(ctx, "r", "c"); return err },
		"usage":     func(ctx context.Context, b *Bucket) error { _, err := b.Usage(ctx, "r", "c"); return err },
		"flush":     func(ctx context.Context, b *Bucket) error { return b.Flush(ctx, "r", "c") },
		"flush all": func(ctx context.Context, b *Bucket) error { return b.FlushAll(ctx, "r") },
	}
	srv := startRedis(t)
	bs := map[string]*Bucket{}
	for name := range methods {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		bs[name] = faultBucket(t, rdb, unlimited(time.Second))
		if res, err := bs[name].Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("%s: Allow before the kill = %+v, %v", name, res, err)
		}
	}
	srv.Kill()
	for name, call := range methods {
		t.Run(name, func(t *testing.T) {
			meter := stall.Start()
			var spans [][2]time.Time
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				start := time.Now()
				err := call(ctx, bs[name])
				spans = append(spans, [2]time.Time{start, time.Now()})
				cancel()
				if !unavailableWithCause(err) {
					t.Errorf("call %d: %v, want ErrUnavailable with its cause", i, err)
				}
			}
			meter.Close()
			took := make([]time.Duration, len(spans))
			for i, s := range spans {
				took[i] = max(s[1].Sub(s[0])-meter.During(s[0], s[1]), 0)
			}
			t.Logf("the first call took %v, the slowest later one %v", took[0], slices.Max(took[1:]))
			// 10 ms as a rule; 110 ms when a probe made on a suspicion
			// (the calls before the kill, slow on a loaded machine) found
			// the server there just before (see Breaker.Suspecting).
			if took[0] > 250*time.Millisecond {
				t.Errorf("the first call took %v (less the scheduler's stalls), want 10ms, or 110ms at worst: it waited for go-redis's dial retries", took[0])
			}
			if slowest := slices.Max(took[1:]); slowest > breakerP99 {
				t.Errorf("a later call took %v, want at most %v", slowest, breakerP99)
			}
		})
	}
}
