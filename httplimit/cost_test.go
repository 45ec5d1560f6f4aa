package httplimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// costPaths weighs the requests of the cost tests.
func costPaths(r *http.Request) int {
	switch r.URL.Path {
	case "/export":
		return 4
	case "/free":
		return 0
	case "/huge":
		return 11
	case "/big":
		return 7
	case "/negative":
		return -1
	}
	return 1
}

// A cost above the client's quota of 10 can never pass: 429 with the
// fields as they stand and no Retry-After, the problem saying why; a cost
// of 0 is served uncounted with the fields as they stand. On miniredis,
// whose clock stands still, and on the real Redis.
func TestCostAboveQuotaAndFree(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		rdb, _ := miniClient(t)
		costSteps(t, rdb, "httplimit", false)
	})
	t.Run("redis", func(t *testing.T) {
		rdb, prefix := realClient(t)
		costSteps(t, rdb, prefix, true)
	})
}

// anyT is the t of a RateLimit item, whatever its value: on the real
// clock a second may pass between two requests.
var anyT = regexp.MustCompile(`;t=[0-9]+`)

// retryDetail is the detail of a problem that repeats Retry-After.
var retryDetail = regexp.MustCompile(`^retry after [0-9]+ s$`)

func costSteps(t *testing.T, rdb *redis.Client, prefix string, realClock bool) {
	b := bucket(t, rdb, leakybucket.WithPrefix(prefix),
		leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.PerMinute(10)))
	h := handler(t, b, WithCost(costPaths), WithProblemDetails(), WithLegacyHeaders(),
		WithFailOpen(func(_ *http.Request, err error) { t.Errorf("reported %v", err) }))
	const never = "the request costs more than the quota: it can never be served"
	for i, s := range []struct {
		path     string
		want     response
		detail   string   // of the problem, on a denial
		violated []string // the policies the problem names
	}{
		{"/free", response{200, `"per-resource-60s";r=100, "per-client-60s";r=10`, "", "10", "10", "0"}, "", nil},
		{"/export", response{200, `"per-resource-60s";r=96;t=60, "per-client-60s";r=6;t=60`, "", "10", "6", "60"}, "", nil},
		// Never: each policy's r as it stands, and t, when its quota is
		// all back (no Retry-After says otherwise: there is none); -06's
		// trio names the client's policy, its quota back in 60 s.
		{"/huge", response{429, `"per-resource-60s";r=96;t=60, "per-client-60s";r=6;t=60`, "", "10", "6", "60"}, never, []string{"per-client-60s"}},
		{"/free", response{200, `"per-resource-60s";r=96;t=60, "per-client-60s";r=6;t=60`, "", "10", "6", "60"}, "", nil},
		{"/export", response{200, `"per-resource-60s";r=92;t=60, "per-client-60s";r=2;t=60`, "", "10", "2", "60"}, "", nil},
		// Full for now, not for ever: Retry-After as usual.
		{"/big", response{429, `"per-resource-60s";r=92, "per-client-60s";r=2;t=60`, "60", "10", "2", "60"}, "retry after 60 s", []string{"per-client-60s"}},
		{"/huge", response{429, `"per-resource-60s";r=92;t=60, "per-client-60s";r=2;t=60`, "", "10", "2", "60"}, never, []string{"per-client-60s"}},
		// Neither the free requests nor the denied ones counted.
		{"/lookup", response{200, `"per-resource-60s";r=91;t=60, "per-client-60s";r=1;t=60`, "", "10", "1", "60"}, "", nil},
	} {
		r := httptest.NewRequest(http.MethodGet, s.path, nil)
		r.RemoteAddr = "203.0.113.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		got, want := responseOf(w), s.want
		if realClock {
			got.rateLimit, want.rateLimit = anyT.ReplaceAllString(got.rateLimit, ";t"), anyT.ReplaceAllString(want.rateLimit, ";t")
			got.retryAfter, want.retryAfter = presence(got.retryAfter), presence(want.retryAfter)
			got.rst, want.rst = presence(got.rst), presence(want.rst)
			s.detail = retryDetail.ReplaceAllString(s.detail, "retry after") // the problem repeats Retry-After
		}
		if got != want {
			t.Errorf("step %d %s:\n got %v\nwant %v", i, s.path, got, want)
		}
		if w.Code != http.StatusTooManyRequests {
			continue
		}
		var p problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("step %d %s: %v in %q", i, s.path, err, w.Body)
		}
		if realClock {
			p.Detail = retryDetail.ReplaceAllString(p.Detail, "retry after")
		}
		if p.Type != ProblemType || p.Status != 429 || p.Detail != s.detail || !slices.Equal(p.Violated, s.violated) {
			t.Errorf("step %d %s: problem %+v, want detail %q, violated %q", i, s.path, p, s.detail, s.violated)
		}
	}
}

// presence keeps of a value that the real clock may change only whether
// there is one.
func presence(v string) string {
	if v == "" {
		return ""
	}
	return "set"
}

// The default denied handler says so too, and the handler finds the
// Result: denied, RetryAfter Never.
func TestCostAboveQuotaText(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	var seen leakybucket.Result
	mw, err := New(b, "GET /", WithCost(costPaths))
	if err != nil {
		t.Fatal(err)
	}
	h := mw(ok)
	r := httptest.NewRequest(http.MethodGet, "/huge", nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	want := "429 too many requests: the request costs more than the quota: it can never be served\n"
	if w.Code != 429 || w.Body.String() != want || w.Result().Header.Get("Retry-After") != "" {
		t.Errorf("%d %q Retry-After %q; want 429 %q and no Retry-After", w.Code, w.Body, w.Result().Header.Get("Retry-After"), want)
	}
	custom, err := New(b, "GET /", WithCost(costPaths), WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = ResultFrom(r.Context())
		w.WriteHeader(429)
	})))
	if err != nil {
		t.Fatal(err)
	}
	custom(ok).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/huge", nil))
	if seen.Allowed || seen.RetryAfter != leakybucket.Never || seen.Remaining != 10 {
		t.Errorf("ResultFrom in the denied handler: %+v, want denied, RetryAfter Never, 10 remaining", seen)
	}
	// Fields, for other servers: no Retry-After when it can never pass.
	if _, rateLimit, retry := Fields(seen); rateLimit != `"per-client-60s";r=10` || retry != "" {
		t.Errorf("Fields = %q, %q; want r=10 and no Retry-After", rateLimit, retry)
	}
}

// A request of cost 0 is only read for: if the read fails it is served
// all the same, without fields, whatever the failure policy; a failure
// open reports the error.
func TestFreeWhenRedisDown(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1})
	defer rdb.Close()
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	var reported []error
	for _, opts := range [][]Option{
		{WithCost(costPaths)},
		{WithCost(costPaths), WithFailOpen(func(_ *http.Request, err error) { reported = append(reported, err) })},
	} {
		h := handler(t, b, opts...)
		r := httptest.NewRequest(http.MethodGet, "/free", nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := responseOf(w); got != (response{status: 200}) || w.Body.String() != "ok" {
			t.Errorf("cost 0, Redis down, %d options: %v %q; want served, no field", len(opts), got, w.Body)
		}
		r = httptest.NewRequest(http.MethodGet, "/lookup", nil)
		w = httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if want := map[int]int{1: 503, 2: 200}[len(opts)]; w.Code != want {
			t.Errorf("cost 1, Redis down, %d options: %d, want %d", len(opts), w.Code, want)
		}
	}
	if len(reported) != 2 {
		t.Errorf("failing open reported %d errors, want the cost-0 read's and the decision's", len(reported))
	}
}
