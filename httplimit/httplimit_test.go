package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// ok is the next handler of the tests: 200 and "ok".
var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })

// handler wraps ok in the middleware of b for resource "GET /", or fails.
func handler(t *testing.T, b *leakybucket.Bucket, opts ...Option) http.Handler {
	t.Helper()
	mw, err := New(b, "GET /", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(ok)
}

// get serves one request from remote through h.
func get(h http.Handler, remote string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type response struct {
	status                                       int
	rateLimit, retryAfter, limit, remaining, rst string
}

func (r response) String() string {
	return fmt.Sprintf("%d RateLimit: %s | Retry-After: %q | -06: %q %q %q", r.status, r.rateLimit, r.retryAfter, r.limit, r.remaining, r.rst)
}

func responseOf(w *httptest.ResponseRecorder) response {
	h := w.Result().Header
	return response{w.Code, h.Get("RateLimit"), h.Get("Retry-After"), h.Get("RateLimit-Limit"), h.Get("RateLimit-Remaining"), h.Get("RateLimit-Reset")}
}

// Every decided response carries the draft-10 fields, one policy per rule;
// a denial is 429 with Retry-After, and no t later than it; the -06 trio
// follows the rule closest to its limit.
func TestHeadersAndStatus(t *testing.T) {
	rdb, mr := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.Per(3, 10*time.Second)))
	h := handler(t, b, WithLegacyHeaders())
	const policy = `"per-resource-60s";q=100;w=60, "per-client-10s";q=3;w=10`
	steps := []struct {
		after time.Duration // since start
		want  response
	}{
		{0, response{200, `"per-resource-60s";r=99;t=60, "per-client-10s";r=2;t=10`, "", "3", "2", "10"}},
		{2 * time.Second, response{200, `"per-resource-60s";r=98;t=60, "per-client-10s";r=1;t=10`, "", "3", "1", "10"}},
		{2500 * time.Millisecond, response{200, `"per-resource-60s";r=97;t=60, "per-client-10s";r=0;t=10`, "", "3", "0", "10"}},
		// Room again when the first call leaves, at 10s: in 7.5s, rounded up.
		// A denial gives t for the rule that denied only: per-resource had
		// room, and gets no more quota in 8s (its calls leave at 60s).
		{2500 * time.Millisecond, response{429, `"per-resource-60s";r=97, "per-client-10s";r=0;t=8`, "8", "3", "0", "8"}},
		{9999 * time.Millisecond, response{429, `"per-resource-60s";r=97, "per-client-10s";r=0;t=1`, "1", "3", "0", "1"}},
		{10 * time.Second, response{200, `"per-resource-60s";r=96;t=60, "per-client-10s";r=0;t=10`, "", "3", "0", "10"}},
	}
	for i, s := range steps {
		mr.SetTime(start.Add(s.after))
		w := get(h, "203.0.113.9:4711")
		if got := responseOf(w); got != s.want {
			t.Errorf("step %d at %v:\n got %v\nwant %v", i, s.after, got, s.want)
		}
		if got := w.Result().Header.Get("RateLimit-Policy"); got != policy {
			t.Errorf("step %d: RateLimit-Policy: %s, want %s", i, got, policy)
		}
		if w.Code == http.StatusTooManyRequests && !strings.Contains(w.Body.String(), "retry after "+s.want.retryAfter+" s") {
			t.Errorf("step %d: denial body %q", i, w.Body)
		}
	}
	// Without the option, no -06 fields.
	if w := get(handler(t, b), "198.51.100.1:1"); w.Result().Header.Get("RateLimit-Limit") != "" || w.Code != 200 {
		t.Errorf("without WithLegacyHeaders: %v", responseOf(w))
	}
}

// Retry-After is the wait in whole seconds, rounded up, never 0 for a
// denial.
func TestRetryAfterRounding(t *testing.T) {
	for _, c := range []struct {
		wait time.Duration
		want int64
	}{
		{0, 1}, {time.Nanosecond, 1}, {time.Millisecond, 1}, {999 * time.Millisecond, 1}, {time.Second, 1},
		{time.Second + time.Millisecond, 2}, {59*time.Second + time.Millisecond, 60}, {time.Hour, 3600},
	} {
		if got := retryAfter(leakybucket.Result{RetryAfter: c.wait}); got != c.want {
			t.Errorf("RetryAfter %v: Retry-After %d, want %d", c.wait, got, c.want)
		}
	}
	rdb, mr := miniClient(t)
	h := handler(t, bucket(t, rdb, leakybucket.PerClient(leakybucket.Per(1, 1500*time.Millisecond))))
	get(h, "203.0.113.9:1")
	for _, c := range []struct {
		after time.Duration
		want  string
	}{{0, "2"}, {499 * time.Millisecond, "2"}, {500 * time.Millisecond, "1"}, {1499 * time.Millisecond, "1"}} {
		mr.SetTime(start.Add(c.after))
		w := get(h, "203.0.113.9:1")
		if got := w.Result().Header.Get("Retry-After"); w.Code != 429 || got != c.want {
			t.Errorf("at %v: %d Retry-After %q, want 429 and %q", c.after, w.Code, got, c.want)
		}
	}
}

// Policies are named by scope and window unless named by the user, quoted
// as Structured Field strings, with w in whole seconds, and no w for a
// window that whole seconds cannot say (q=10;w=1 would claim 10 per
// second of a rule that admits 20).
func TestPolicyNames(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb,
		leakybucket.PerClient(leakybucket.Per(10, 500*time.Millisecond)),
		leakybucket.PerClient(leakybucket.Per(20, 500*time.Millisecond)),
		leakybucket.PerResource(leakybucket.Per(100, 90*time.Second)))
	for _, c := range []struct {
		names []string
		want  string
	}{
		{nil, `"per-client-500ms";q=10, "per-client-500ms-2";q=20, "per-resource-90s";q=100;w=90`},
		{[]string{"burst", `a "b" \c`, "all"}, `"burst";q=10, "a \"b\" \\c";q=20, "all";q=100;w=90`},
	} {
		w := get(handler(t, b, WithPolicyNames(c.names...)), "203.0.113.9:1")
		if got := w.Result().Header.Get("RateLimit-Policy"); got != c.want {
			t.Errorf("names %q: RateLimit-Policy %s, want %s", c.names, got, c.want)
		}
	}
	for _, bad := range [][]string{{"a", "b"}, {"a", "b", "a"}, {"a", "", "c"}, {"a", "b", "é"}, {"a", "b", "new\nline"}} {
		if _, err := New(b, "GET /", WithPolicyNames(bad...)); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("names %q: %v, want ErrInvalidOption", bad, err)
		}
	}
}

func TestInvalidOptions(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(1)))
	for name, c := range map[string]struct {
		b        *leakybucket.Bucket
		resource string
		opt      Option
	}{
		"nil Bucket":       {nil, "r", nil},
		"nil KeyFunc":      {b, "r", WithKey(nil)},
		"nil denied":       {b, "r", WithDeniedHandler(nil)},
		"nil error":        {b, "r", WithErrorHandler(nil)},
		"negative timeout": {b, "r", WithDecisionTimeout(-time.Second)},
		"IPv6 prefix -1":   {b, "r", WithIPv6Prefix(-1)},
		"IPv6 prefix 129":  {b, "r", WithIPv6Prefix(129)},
	} {
		if _, err := New(c.b, c.resource, c.opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

// The next handler and the denied handler find the Result; a replaced
// denied handler writes its own body.
func TestResultFromAndDeniedHandler(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(1)))
	denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, ok := ResultFrom(r.Context())
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprintf(w, `{"denied-by": %q, "found": %v}`, res.DeniedBy[0].String(), ok)
	})
	mw, err := New(b, "GET /", WithDeniedHandler(denied))
	if err != nil {
		t.Fatal(err)
	}
	var remaining atomic.Int64
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ := ResultFrom(r.Context())
		remaining.Store(int64(res.Remaining) + 1)
	}))
	if w := get(h, "203.0.113.9:1"); w.Code != 200 || remaining.Load() != 1 {
		t.Errorf("first: %d, Result seen by the handler: remaining+1 = %d, want 1", w.Code, remaining.Load())
	}
	w := get(h, "203.0.113.9:1")
	if want := `{"denied-by": "per-client 1 per 1m0s", "found": true}`; w.Code != 429 || w.Body.String() != want || w.Result().Header.Get("Retry-After") != "60" {
		t.Errorf("second: %d %q Retry-After %q, want 429 %s and 60", w.Code, w.Body, w.Result().Header.Get("Retry-After"), want)
	}
	if _, ok := ResultFrom(context.Background()); ok {
		t.Error("ResultFrom found a Result outside the middleware")
	}
}

// A request that cannot be keyed is refused with 400, also when failing
// open, and its handler never runs.
func TestKeyErrors(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	for name, opts := range map[string][]Option{
		"closed": {WithKey(Header("X-API-Key", nil))},
		"open":   {WithKey(Header("X-API-Key", nil)), WithFailOpen(func(*http.Request, error) { t.Error("a key error was reported as a limiter error") })},
		"empty":  {WithKey(func(*http.Request) (string, error) { return "", nil })},
	} {
		w := get(handler(t, b, opts...), "203.0.113.9:1")
		if w.Code != http.StatusBadRequest || w.Body.String() == "ok" {
			t.Errorf("%s: %d %q, want 400", name, w.Code, w.Body)
		}
	}
	var got error
	onError := WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) { got = err; w.WriteHeader(401) })
	if w := get(handler(t, b, WithKey(Header("X-API-Key", nil)), onError), "203.0.113.9:1"); w.Code != 401 || !errors.Is(got, ErrKey) || !errors.Is(got, ErrNoKey) {
		t.Errorf("error handler: %d, %v; want 401 and ErrKey, ErrNoKey", w.Code, got)
	}
}

// When Redis is down or silent, failing open serves the request and
// reports the error; failing closed answers 503. Either way the answer
// comes by the decision's deadline.
func TestRedisDown(t *testing.T) {
	for name, addr := range map[string]string{"refused": closedAddr(t), "silent": silentAddr(t)} {
		t.Run(name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
			const timeout = 200 * time.Millisecond
			began := time.Now()
			failOpen(t, b, timeout)
			w := get(handler(t, b, WithDecisionTimeout(timeout)), "203.0.113.9:1")
			if w.Code != http.StatusServiceUnavailable || w.Body.String() == "ok" {
				t.Errorf("fail closed: %d %q, want 503", w.Code, w.Body)
			}
			if took := time.Since(began); took > 4*timeout+time.Second {
				t.Errorf("two decisions with a deadline of %v took %v", timeout, took)
			}
		})
	}
}

// failOpen checks that a request through b, failing open, is served and
// its error reported once.
func failOpen(t *testing.T, b *leakybucket.Bucket, timeout time.Duration) {
	t.Helper()
	var reported []error
	var mu sync.Mutex
	open := handler(t, b, WithDecisionTimeout(timeout), WithFailOpen(func(_ *http.Request, err error) {
		mu.Lock()
		reported = append(reported, err)
		mu.Unlock()
	}))
	w := get(open, "203.0.113.9:1")
	if w.Code != 200 || w.Body.String() != "ok" || len(reported) != 1 || w.Result().Header.Get("RateLimit") != "" {
		t.Fatalf("fail open: %d %q, reported %v; want served, one error reported, no RateLimit", w.Code, w.Body, reported)
	}
	if err := reported[0]; !errors.Is(err, leakybucket.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fail open reported %v, want ErrUnavailable or the decision's deadline", err)
	}
}

// A client that went away before the decision is not answered, and its
// cancelled context is not reported as a limiter error.
func TestClientGone(t *testing.T) {
	rdb, _ := miniClient(t)
	h := handler(t, bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10))),
		WithFailOpen(func(_ *http.Request, err error) { t.Errorf("reported %v", err) }))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Body.Len() != 0 {
		t.Errorf("a gone client was answered: %q", w.Body)
	}
}

// 50 concurrent requests from one client, over HTTP, on a limit of 10:
// exactly 10 are served, 40 get 429, on miniredis and on the real Redis.
func TestConcurrentRequestsAdmitExactlyTheLimit(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		rdb, _ := miniClient(t)
		concurrent(t, rdb, "leakybucket")
	})
	t.Run("redis", func(t *testing.T) {
		rdb, prefix := realClient(t)
		concurrent(t, rdb, prefix)
	})
}

func concurrent(t *testing.T, rdb *redis.Client, prefix string) {
	t.Helper()
	const limit, requests = 10, 50
	for _, s := range []leakybucket.Strategy{leakybucket.Logs, leakybucket.SortedSet, leakybucket.Windows(time.Second)} {
		b := bucket(t, rdb, leakybucket.WithStrategy(s), leakybucket.WithPrefix(prefix),
			leakybucket.PerResource(leakybucket.PerMinute(limit)), leakybucket.PerClient(leakybucket.PerMinute(requests)))
		// A deadline no loaded machine misses: the test counts admissions.
		srv := httptest.NewServer(handler(t, b, WithDecisionTimeout(10*time.Second)))
		codes := make(chan int, requests)
		var wg sync.WaitGroup
		for range requests {
			wg.Go(func() {
				resp, err := srv.Client().Get(srv.URL)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				codes <- resp.StatusCode
			})
		}
		wg.Wait()
		srv.Close()
		close(codes)
		count := map[int]int{}
		for c := range codes {
			count[c]++
		}
		if count[200] != limit || count[429] != requests-limit {
			t.Errorf("%v: %d concurrent requests on a limit of %d: %v, want %d served and %d denied", s, requests, limit, count, limit, requests-limit)
		}
	}
}
