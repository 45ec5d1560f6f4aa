//go:build linux

package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/internal/redisserver"
	"github.com/leakybucket/leakybucket/internal/stall"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The outage, as a user meets it: a client of go-redis's default options
// (the Quick start's), Redis killed, ten clients in turn making 20 calls
// each, within the interceptor's default decision timeout (500 ms).
const (
	outageClients = 10
	outageCalls   = 20
	outageP99     = 20 * time.Millisecond
)

// TestOutage: the interceptors inherit the Bucket's breaker. With Redis
// killed (SIGKILL), under every strategy: after the first call that could
// not be decided, the p99 of a call's time (less the scheduler's stalls
// while it ran) is at most 20 ms; failing closed, every call is refused
// with codes.Unavailable, the status the package documents, saying
// ErrUnavailable's text; failing open, every call is served and every
// error reported after the first matches ErrUnavailable and keeps its
// network cause; and calls are decided again within a second of a
// restart on the same port.
func TestOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real server")
	}
	for _, s := range []leakybucket.Strategy{leakybucket.Logs, leakybucket.SortedSet, leakybucket.Windows(time.Millisecond)} {
		for _, open := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/fail open %v", s, open), func(t *testing.T) { testOutage(t, s, open) })
		}
	}
}

func testOutage(t *testing.T, s leakybucket.Strategy, open bool) {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBucket(t, rdb, leakybucket.WithStrategy(s), leakybucket.PerClient(leakybucket.PerMinute(1_000_000)))
	var mu sync.Mutex
	var reported []error
	opts := []Option{WithKey(clientKey)}
	if open {
		opts = append(opts, WithFailOpen(func(_ context.Context, _ string, err error) {
			mu.Lock()
			reported = append(reported, err)
			mu.Unlock()
		}))
	}
	c := serve(t, b, opts...)
	ctx := context.Background()
	if _, err := c.Check(as(ctx, "c0"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	srv.Kill()
	calls := outageRun(c)
	if open {
		mu.Lock()
		checkReported(t, reported)
		mu.Unlock()
	} else {
		checkRefused(t, calls)
	}
	checkFast(t, calls, open, len(reported))
	srv.Restart(t)
	checkDecidedAgain(t, c, "c0", "")
}

// outageCall is one call of the outage: how long it took less the
// scheduler's stalls meanwhile, and its error.
type outageCall struct {
	took time.Duration
	err  error
}

// outageRun makes the outage's calls, each client's in turn.
func outageRun(c healthpb.HealthClient) []outageCall {
	meter := stall.Start()
	var calls []outageCall
	var spans [][2]time.Time
	for client := range outageClients {
		for range outageCalls {
			start := time.Now()
			_, err := c.Check(as(context.Background(), fmt.Sprint("c", client)), &healthpb.HealthCheckRequest{})
			spans = append(spans, [2]time.Time{start, time.Now()})
			calls = append(calls, outageCall{err: err})
		}
	}
	meter.Close()
	for i, s := range spans {
		calls[i].took = max(s[1].Sub(s[0])-meter.During(s[0], s[1]), 0)
	}
	return calls
}

// checkRefused checks, failing closed, that every call was refused with
// codes.Unavailable, and every one after the first with ErrUnavailable's
// text in its message.
func checkRefused(t *testing.T, calls []outageCall) {
	t.Helper()
	for i, c := range calls {
		st, _ := status.FromError(c.err)
		if st.Code() != codes.Unavailable {
			t.Fatalf("call %d: %v, want Unavailable", i, c.err)
		}
		if i > 0 && !strings.Contains(st.Message(), leakybucket.ErrUnavailable.Error()) {
			t.Errorf("call %d: %q, want ErrUnavailable's text", i, st.Message())
		}
	}
}

// checkReported checks, failing open, that every error reported after the
// first matches ErrUnavailable and keeps its network cause.
func checkReported(t *testing.T, reported []error) {
	t.Helper()
	if len(reported) < 2 {
		t.Fatalf("%d errors reported, want one per call", len(reported))
	}
	for i, err := range reported[1:] {
		if !unavailableWithCause(err) {
			t.Errorf("reported error %d: %v, want ErrUnavailable with its network cause", i+1, err)
		}
	}
}

// unavailableWithCause reports whether err matches ErrUnavailable and a
// network error that says the server is gone.
func unavailableWithCause(err error) bool {
	return errors.Is(err, leakybucket.ErrUnavailable) &&
		(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF))
}

// checkFast checks the p99 of the calls after the first that could not be
// decided: failing closed, the first call; failing open, the first whose
// error was reported (every call was served).
func checkFast(t *testing.T, calls []outageCall, open bool, reported int) {
	t.Helper()
	if open && reported != len(calls) {
		t.Errorf("%d errors reported for %d calls, want one each", reported, len(calls))
	}
	if open {
		for i, c := range calls {
			if c.err != nil {
				t.Fatalf("call %d failing open: %v, want served", i, c.err)
			}
		}
	}
	later := slices.Sorted(func(yield func(time.Duration) bool) {
		for _, c := range calls[1:] {
			if !yield(c.took) {
				return
			}
		}
	})
	p99 := later[len(later)*99/100]
	t.Logf("the first call took %v; p99 of the rest %v, slowest %v", calls[0].took, p99, later[len(later)-1])
	if p99 > outageP99 {
		t.Errorf("p99 of the %d calls after the first = %v, want at most %v", len(later), p99, outageP99)
	}
}

// checkDecidedAgain checks that a call of client is decided again,
// served with the RateLimit fields (RateLimit-Policy policy, if not
// empty), within a second of the restart.
func checkDecidedAgain(t *testing.T, c healthpb.HealthClient, client, policy string) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		var trailer metadata.MD
		_, err := c.Check(as(context.Background(), client), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		if got := trailer.Get(TrailerPolicy); err == nil && len(trailer.Get(TrailerRateLimit)) == 1 && (policy == "" || got[0] == policy) {
			if took := time.Since(start); took > time.Second {
				t.Errorf("decided again %v after the restart, want within 1s", took)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("no call decided within 5s of the restart")
}

// TestOutageFallback: with the Bucket's fallback (WithFallback(2)), Redis
// killed: no call is refused Unavailable; each is decided in process by
// the rule's share, 5 of 10 a minute, which the trailer's fields
// advertise (5 served, then ResourceExhausted with RetryInfo); and calls
// are decided by Redis again, with the rule's own quota, within a second
// of a restart.
func TestOutageFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real server")
	}
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	b := newBucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)), leakybucket.WithFallback(2))
	// Only a call the fallback could not decide fails, not one that this
	// loaded machine stalled.
	c := serve(t, b, WithKey(clientKey), WithDecisionTimeout(5*time.Second))
	ctx := context.Background()
	const onRedis, inProcess = `"per-client-60s";q=10;w=60`, `"per-client-60s";q=5;w=60`
	var trailer metadata.MD
	if _, err := c.Check(as(ctx, "a"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer)); err != nil {
		t.Fatalf("before the kill: %v", err)
	}
	checkTrailer(t, trailer, TrailerPolicy, onRedis)
	srv.Kill()
	for i := range 8 {
		var trailer metadata.MD
		_, err := c.Check(as(ctx, "b"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		if i < 5 && err != nil {
			t.Errorf("call %d in process: %v, want served", i, err)
		}
		if i >= 5 {
			checkDenied(t, err)
		}
		checkTrailer(t, trailer, TrailerPolicy, inProcess)
	}
	srv.Restart(t)
	checkDecidedAgain(t, c, "c", onRedis)
}
