package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/inflight"
)

type startKey struct{}

// span is when a request started, and when the Bucket admitted it.
type span struct{ start, end time.Time }

// countInFlight counts an inflight Limiter's refusals.
type countInFlight struct{ acquired, refused, released atomic.Int64 }

func (c *countInFlight) Acquired(string, int, time.Duration) { c.acquired.Add(1) }
func (c *countInFlight) Refused(string, int, error)          { c.refused.Add(1) }
func (c *countInFlight) Released(string, int, error)         { c.released.Add(1) }

// TestInFlightWithRate: a route limited to 2 in flight and 10 per
// second, 50 concurrent clients: never more than 2 handlers run at once,
// never more than 10 are admitted in a second, and a request refused by
// either limit is charged by neither: the Bucket decides exactly the
// requests that got a lease, and every lease is released.
func TestInFlightWithRate(t *testing.T) {
	// Replies no loaded machine delays this long: a reply later than
	// go-redis's 3 s default is Redis not answering (ErrUnavailable, a
	// 503), which this test is not about; one took that long in make
	// test beside a CPU hog, with the root package's suite on the same
	// server.
	rdb, prefix := realClient(t, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 10*time.Second, 10*time.Second })
	var decided, admitted atomic.Int64
	var mu sync.Mutex
	var spans []span // of each admitted request's decision
	b := bucket(t, rdb, leakybucket.WithPrefix(prefix), leakybucket.PerResource(leakybucket.PerSecond(10)), leakybucket.WithStrategy(leakybucket.SortedSet),
		leakybucket.WithObserver(func(ctx context.Context, d leakybucket.Decision) {
			if d.Op == "allow" && d.Err == nil {
				decided.Add(1)
				if d.Allowed {
					admitted.Add(1)
					mu.Lock()
					spans = append(spans, span{*ctx.Value(startKey{}).(*time.Time), time.Now()})
					mu.Unlock()
				}
			}
		}))
	counts := &countInFlight{}
	l, err := inflight.New(rdb, inflight.PerResource(2), inflight.WithPrefix(prefix+":if"), inflight.WithObserver(counts))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(b, "route", WithKey(func(r *http.Request) (string, error) {
		*r.Context().Value(startKey{}).(*time.Time) = time.Now() // before the lease and the decision
		return "client", nil
	}),
		// A decision timeout no loaded machine reaches: the test counts
		// what was decided and charged, and a decision cut short by its
		// deadline after its request got a lease is neither (one took
		// over a second beside two other test suites, at a load of 9).
		WithInFlight(l, 100*time.Millisecond), WithDecisionTimeout(10*time.Second),
		WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}))
	if err != nil {
		t.Fatal(err)
	}
	var running, most, served atomic.Int64
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		served.Add(1)
		time.Sleep(30 * time.Millisecond)
		running.Add(-1)
	}))
	var requests, refused atomic.Int64
	var codes sync.Map
	end := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			for time.Now().Before(end) {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				h.ServeHTTP(rec, req.WithContext(context.WithValue(req.Context(), startKey{}, new(time.Time))))
				requests.Add(1)
				if c := rec.Code; c != http.StatusOK && c != http.StatusTooManyRequests {
					codes.Store(c, rec.Body.String())
				}
				if rec.Code == http.StatusTooManyRequests {
					refused.Add(1)
					if rec.Header().Get("Retry-After") == "" {
						t.Error("429 without Retry-After")
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d requests, %d refused (%d by the in-flight limit), %d served, at most %d at once",
		requests.Load(), refused.Load(), counts.refused.Load(), served.Load(), most.Load())
	codes.Range(func(c, body any) bool {
		t.Errorf("a response %v: %s", c, body)
		return true
	})
	if most.Load() > 2 {
		t.Errorf("%d handlers ran at once, limit 2", most.Load())
	}
	if served.Load() != admitted.Load() || requests.Load() != served.Load()+refused.Load() {
		t.Errorf("served %d, the Bucket admitted %d; %d requests, %d refused", served.Load(), admitted.Load(), requests.Load(), refused.Load())
	}
	if decided.Load() != counts.acquired.Load() {
		t.Errorf("the Bucket decided %d requests, %d got a lease: a request refused in flight was charged", decided.Load(), counts.acquired.Load())
	}
	if counts.released.Load() != counts.acquired.Load() {
		t.Errorf("%d leases acquired, %d released", counts.acquired.Load(), counts.released.Load())
	}
	// Never more than 10 admitted in any second: each decision was made
	// by Redis between the request's start and the observer's call, so 11
	// of them all within one span shorter than a second are 11 within a
	// second.
	slices.SortFunc(spans, func(a, b span) int { return a.end.Compare(b.end) })
	for i := 10; i < len(spans); i++ {
		first := slices.MinFunc(spans[i-10:i+1], func(a, b span) int { return a.start.Compare(b.start) }).start
		if d := spans[i].end.Sub(first); d < time.Second {
			t.Errorf("11 admitted within %v", d)
		}
	}
	// An acquisition whose waiter gave up as it ran is taken back in the
	// background: within a second here.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		u, err := l.Held(context.Background(), "route")
		if err == nil && u.Held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the load: %+v, %v", u, err)
		}
	}
}
