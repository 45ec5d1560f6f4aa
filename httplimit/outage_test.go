//go:build linux

package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/internal/redisserver"
	"github.com/leakybucket/leakybucket/internal/stall"
	"github.com/redis/go-redis/v9"
)

// The middleware inherits the Bucket's breaker: with Redis killed and a
// client of go-redis's default options (the Quick start's), 200 requests
// with 500 ms decision deadlines are answered at once after the first few
// (p99 <= 10 ms, plus the scheduler's lag on a loaded machine), 503 when
// failing closed, served when failing open with ErrUnavailable reported;
// and requests are limited again within a second of a restart on the same
// port.
func TestOutageFailsFast(t *testing.T) {
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprint("fail open ", open), func(t *testing.T) {
			srv := redisserver.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(1_000_000)))
			var reported []error
			opts := []Option{WithDecisionTimeout(500 * time.Millisecond)}
			if open {
				opts = append(opts, WithFailOpen(func(_ *http.Request, err error) { reported = append(reported, err) }))
			}
			h := handler(t, b, opts...)
			if w := get(h, "203.0.113.9:1"); w.Code != http.StatusOK {
				t.Fatalf("before the kill: %d %q", w.Code, w.Body)
			}
			srv.Kill()
			want := http.StatusServiceUnavailable
			if open {
				want = http.StatusOK
			}
			checkOutage(t, h, want)
			if open && countUnavailable(reported) < len(reported)*95/100 {
				t.Errorf("%d of %d reported errors match ErrUnavailable", countUnavailable(reported), len(reported))
			}
			srv.Restart(t)
			checkRecovery(t, h)
		})
	}
}

// outageRequests is how many requests the outage test sends, and how many
// of the first may wait for go-redis's retries, before the breaker knew.
const (
	outageRequests = 200
	outageFirst    = 5
)

// checkOutage sends the outage's requests one after the other and checks
// their statuses and how long the later ones took.
func checkOutage(t *testing.T, h http.Handler, want int) {
	t.Helper()
	var took []time.Duration
	var lag time.Duration // the worst lateness of a 1 ms sleep: the scheduler's share
	for i := range outageRequests {
		start := time.Now()
		w := get(h, "203.0.113.9:1")
		took = append(took, time.Since(start))
		if w.Code != want {
			t.Fatalf("request %d: %d %q, want %d", i, w.Code, w.Body, want)
		}
		slept := time.Now()
		time.Sleep(time.Millisecond)
		lag = max(lag, time.Since(slept)-time.Millisecond)
	}
	later := slices.Sorted(slices.Values(took[outageFirst:]))
	p99 := later[len(later)*99/100]
	t.Logf("first requests took %v; p99 of the rest %v (scheduler lag up to %v)", took[:outageFirst], p99, lag)
	if p99 > 10*time.Millisecond+lag {
		t.Errorf("p99 of the requests after the first %d = %v, want at most 10ms (+%v of lag)", outageFirst, p99, lag)
	}
}

// checkRecovery checks that a request is decided again within a second
// of the restart.
func checkRecovery(t *testing.T, h http.Handler) {
	t.Helper()
	checkDecidedBy(t, h, "203.0.113.9:1", "")
}

// checkDecidedBy checks that a request from remote is served with the
// RateLimit fields (RateLimit-Policy policy, if not empty) within a
// second of the restart.
func checkDecidedBy(t *testing.T, h http.Handler, remote, policy string) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		w := get(h, remote)
		if h := w.Result().Header; w.Code == http.StatusOK && h.Get("RateLimit") != "" && (policy == "" || h.Get("RateLimit-Policy") == policy) {
			if took := time.Since(start); took > time.Second {
				t.Errorf("decided again %v after the restart, want within 1s", took)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no request decided within 5s of the restart")
}

func countUnavailable(errs []error) int {
	n := 0
	for _, err := range errs {
		if errors.Is(err, leakybucket.ErrUnavailable) && errors.Unwrap(err) != nil {
			n++
		}
	}
	return n
}

// TestOutageEachStrategy: the middleware, failing open, under every
// strategy, with ten clients in turn and Redis killed: after the first
// request that failed to be decided, the p99 of the middleware's own time
// (less the scheduler's stalls while it ran) is at most 20 ms, every later
// reported error matches ErrUnavailable and keeps its cause, and requests
// are decided again within a second of a restart.
func TestOutageEachStrategy(t *testing.T) {
	for _, s := range []leakybucket.Strategy{leakybucket.Logs, leakybucket.SortedSet, leakybucket.Windows(time.Millisecond)} {
		t.Run(s.String(), func(t *testing.T) {
			srv := redisserver.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			b := bucket(t, rdb, leakybucket.WithStrategy(s), leakybucket.PerClient(leakybucket.PerMinute(1_000_000)))
			var reported []error
			h := handler(t, b, WithDecisionTimeout(500*time.Millisecond),
				WithFailOpen(func(_ *http.Request, err error) { reported = append(reported, err) }))
			if w := get(h, "203.0.113.9:1"); w.Code != http.StatusOK {
				t.Fatalf("before the kill: %d %q", w.Code, w.Body)
			}
			srv.Kill()
			meter := stall.Start()
			var own []time.Duration
			for c := range 10 {
				for range 20 {
					start := time.Now()
					get(h, fmt.Sprintf("203.0.113.%d:1", c+10))
					end := time.Now()
					if len(reported) > 0 { // after the first failed request
						own = append(own, end.Sub(start))
					}
					if len(own) > 0 {
						own[len(own)-1] -= min(meter.During(start, end), own[len(own)-1])
					}
				}
			}
			meter.Close()
			// The first failed request may have spent its deadline (and
			// say only that); every later one must say ErrUnavailable.
			if len(reported) < 2 || countUnavailable(reported[1:]) != len(reported)-1 {
				t.Errorf("%d of %d reported errors after the first match ErrUnavailable with a cause, want all: %v", countUnavailable(reported[1:]), len(reported)-1, reported)
			}
			slices.Sort(own)
			if p99 := own[len(own)*99/100]; p99 > 20*time.Millisecond {
				t.Errorf("p99 of the %d requests after the first failed one = %v, want at most 20ms", len(own), p99)
			}
			srv.Restart(t)
			checkRecovery(t, h)
		})
	}
}

// TestOutageFallback: with the Bucket's fallback (WithFallback(2)), under
// every strategy, Redis killed: no request waits for it nor reaches the
// failure policy; each is decided in process by the share of the rule, 5
// of 10 a minute, which RateLimit-Policy advertises while it applies: 5
// served, then 429 with Retry-After; and requests are decided by Redis
// again, with the rule's own quota, within a second of a restart.
func TestOutageFallback(t *testing.T) {
	for _, s := range []leakybucket.Strategy{leakybucket.Logs, leakybucket.SortedSet, leakybucket.Windows(time.Millisecond)} {
		t.Run(s.String(), func(t *testing.T) {
			srv := redisserver.Start(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			b := bucket(t, rdb, leakybucket.WithStrategy(s), leakybucket.PerClient(leakybucket.PerMinute(10)), leakybucket.WithFallback(2))
			var reported []error
			// A decision timeout long enough that only a request the
			// fallback could not decide fails, not one that this loaded
			// machine stalled.
			h := handler(t, b, WithDecisionTimeout(5*time.Second), WithFailOpen(func(_ *http.Request, err error) { reported = append(reported, err) }))
			const onRedis, inProcess = `"per-client-60s";q=10;w=60`, `"per-client-60s";q=5;w=60`
			if w := get(h, "203.0.113.9:1"); w.Code != http.StatusOK || w.Header().Get("RateLimit-Policy") != onRedis {
				t.Fatalf("before the kill: %v, policy %q", responseOf(w), w.Header().Get("RateLimit-Policy"))
			}
			srv.Kill()
			var took []time.Duration
			for i := range 8 {
				start := time.Now()
				w := get(h, "203.0.113.10:1")
				took = append(took, time.Since(start))
				want := http.StatusOK
				if i >= 5 {
					want = http.StatusTooManyRequests
				}
				if w.Code != want || w.Header().Get("RateLimit-Policy") != inProcess || (i >= 5) != (w.Header().Get("Retry-After") != "") {
					t.Errorf("request %d in process: %v, policy %q; want %d, policy %s", i, responseOf(w), w.Header().Get("RateLimit-Policy"), want, inProcess)
				}
			}
			t.Logf("requests in process took %v", took)
			if slowest := slices.Max(took[1:]); slowest > 10*time.Millisecond {
				t.Errorf("a request after the first took %v in process, want at most 10ms", slowest)
			}
			if len(reported) > 0 {
				t.Errorf("the failure policy heard %v, want nothing: the fallback decides", reported)
			}
			srv.Restart(t)
			checkDecidedBy(t, h, "203.0.113.11:1", onRedis)
		})
	}
}
