package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/inflight"
)

// observer sends each Decision to heard, without its Latency, the only
// field two runs need not share.
func observer(heard chan<- leakybucket.Decision) leakybucket.Option {
	return leakybucket.WithObserver(func(_ context.Context, d leakybucket.Decision) {
		d.Latency = 0
		heard <- d
	})
}

// shadowFields are the fields a shadow run must send as the enforcing one.
var shadowFields = []string{
	"RateLimit", "RateLimit-Policy", "Retry-After",
	"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
	"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
}

// shadowRun is one middleware on a fresh miniredis, with what its
// Bucket's observer heard.
type shadowRun struct {
	h     http.Handler
	heard chan leakybucket.Decision
	set   func(time.Time)
}

// newShadowRun serves, through a Bucket of 5 a minute per resource and 3
// per 10 s per client, a handler that reports in X-Allowed what
// ResultFrom says.
func newShadowRun(t *testing.T, opts ...Option) shadowRun {
	t.Helper()
	rdb, mr := miniClient(t)
	run := shadowRun{heard: make(chan leakybucket.Decision, 4), set: mr.SetTime}
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(5)),
		leakybucket.PerClient(leakybucket.Per(3, 10*time.Second)), observer(run.heard))
	cost := WithCost(func(r *http.Request) int { n, _ := strconv.Atoi(r.Header.Get("X-Cost")); return max(n, 1) })
	mw, err := New(b, "GET /", append([]Option{cost, WithLegacyHeaders(), WithHTTPRateHeaders()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	run.h = mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, _ := ResultFrom(r.Context())
		w.Header().Set("X-Allowed", strconv.FormatBool(res.Allowed))
	}))
	return run
}

// TestShadow serves one sequence of requests through an enforcing
// middleware and a shadow one, each on a fresh Redis: the shadow one
// serves every request, with the same fields and the same Decisions
// (marked Shadow), and its next handler sees the denials.
func TestShadow(t *testing.T) {
	enforcing, shadow := newShadowRun(t), newShadowRun(t, WithShadow())
	steps := []struct {
		after  time.Duration
		remote string
		cost   string
	}{
		{0, "203.0.113.1:1", ""}, {time.Second, "203.0.113.1:1", ""}, {time.Second, "203.0.113.1:1", ""},
		{2 * time.Second, "203.0.113.1:1", ""},  // the 4th of a client: denied per client
		{3 * time.Second, "203.0.113.1:1", "4"}, // above the client's quota: never
		{3 * time.Second, "203.0.113.2:1", "2"},
		{4 * time.Second, "203.0.113.3:1", ""},  // the resource is full: denied per resource
		{11 * time.Second, "203.0.113.1:1", ""}, // the client has room, the resource none
		{61 * time.Second, "203.0.113.1:1", ""}, // both have room
	}
	denials := 0
	for i, s := range steps {
		enforcing.set(start.Add(s.after))
		shadow.set(start.Add(s.after))
		we := get(enforcing.h, s.remote, "X-Cost", s.cost)
		ws := get(shadow.h, s.remote, "X-Cost", s.cost)
		if checkShadowResponse(t, i, we, ws) {
			denials++
		}
		checkHeard(t, i, enforcing.heard, shadow.heard)
	}
	if denials != 4 {
		t.Errorf("the enforcing run denied %d requests, want 4", denials)
	}
}

// checkShadowResponse checks that the shadow run served what the
// enforcing one answered, with the same fields, and says whether the
// enforcing one denied it.
func checkShadowResponse(t *testing.T, step int, we, ws *httptest.ResponseRecorder) (denied bool) {
	t.Helper()
	denied = we.Code == http.StatusTooManyRequests
	if !denied && we.Code != http.StatusOK {
		t.Fatalf("step %d: enforcing %d, want 200 or 429", step, we.Code)
	}
	if ws.Code != http.StatusOK || ws.Header().Get("X-Allowed") != strconv.FormatBool(!denied) {
		t.Errorf("step %d: shadow %d, ResultFrom Allowed %s; want 200, %t", step, ws.Code, ws.Header().Get("X-Allowed"), !denied)
	}
	for _, f := range shadowFields {
		if e, s := we.Header().Values(f), ws.Header().Values(f); !slices.Equal(e, s) {
			t.Errorf("step %d: %s: shadow %q, enforcing %q", step, f, s, e)
		}
	}
	return denied
}

// checkHeard checks that the shadow run's observer heard one Decision,
// the enforcing run's but marked Shadow.
func checkHeard(t *testing.T, step int, enforcing, shadow chan leakybucket.Decision) {
	t.Helper()
	if len(enforcing) != 1 || len(shadow) != 1 {
		t.Fatalf("step %d: heard %d and %d decisions, want 1 each", step, len(enforcing), len(shadow))
	}
	e, s := <-enforcing, <-shadow
	if e.Shadow = !e.Shadow; !reflect.DeepEqual(e, s) {
		t.Errorf("step %d: shadow heard %+v, want %+v", step, s, e)
	}
}

// Under WithShadow a request WithInFlight refuses is served, with its
// Retry-After, holding no lease and not asked of the Bucket, as the
// enforcing middleware refuses it without asking.
func TestShadowInFlight(t *testing.T) {
	for _, shadowed := range []bool{false, true} {
		rdb, _ := miniClient(t)
		l, err := inflight.New(rdb, inflight.PerResource(1))
		if err != nil {
			t.Fatal(err)
		}
		le, err := l.Acquire(context.Background(), "GET /", "ip:203.0.113.1")
		if err != nil {
			t.Fatal(err)
		}
		heard := make(chan leakybucket.Decision, 1)
		b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(3)), observer(heard))
		opts := []Option{WithInFlight(l, 0)}
		if shadowed {
			opts = append(opts, WithShadow())
		}
		w := get(handler(t, b, opts...), "203.0.113.1:1")
		want := http.StatusTooManyRequests
		if shadowed {
			want = http.StatusOK
		}
		if w.Code != want || w.Header().Get("Retry-After") != "1" || len(heard) != 0 {
			t.Errorf("shadow %t: %d, Retry-After %q; want %d, 1, and the Bucket not asked", shadowed, w.Code, w.Header().Get("Retry-After"), want)
		}
		if err := le.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
