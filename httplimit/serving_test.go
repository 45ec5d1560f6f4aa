package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

// A skipped request reaches the handler with no RateLimit field and is
// not counted.
func TestSkip(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(2)))
	h := handler(t, b, WithSkip(func(r *http.Request) bool { return r.Header.Get("X-Health") != "" }))
	for range 5 {
		w := get(h, "203.0.113.9:1", "X-Health", "1")
		if got := responseOf(w); got != (response{status: 200}) || w.Result().Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("skipped: %v, policy %q; want 200 and no field", got, w.Result().Header.Get("RateLimit-Policy"))
		}
	}
	if got, want := responseOf(get(h, "203.0.113.9:1")), (response{status: 200, rateLimit: `"per-client-60s";r=1;t=60`}); got != want {
		t.Errorf("after 5 skipped: %v, want %v", got, want)
	}
}

// A request weighs what WithCost says. A cost above the quota can never
// pass: 429 with the fields as they stand and no Retry-After. A cost of 0
// is served uncounted, with the fields as they stand. A negative cost is
// the server's bug: refused, whatever the failure policy.
func TestCost(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	cost := WithCost(costPaths)
	h := handler(t, b, cost, WithFailOpen(func(*http.Request, error) { t.Error("a cost error was reported as a limiter error") }))
	for i, s := range []struct {
		path string
		want response
	}{
		{"/export", response{status: 200, rateLimit: `"per-client-60s";r=6;t=60`}},
		{"/export", response{status: 200, rateLimit: `"per-client-60s";r=2;t=60`}},
		{"/export", response{status: 429, rateLimit: `"per-client-60s";r=2;t=60`, retryAfter: "60"}},
		{"/lookup", response{status: 200, rateLimit: `"per-client-60s";r=1;t=60`}},
		// Served, counted nowhere: the fields as they stand.
		{"/free", response{status: 200, rateLimit: `"per-client-60s";r=1;t=60`}},
		// Never: what remains, when it is all back, no Retry-After.
		{"/huge", response{status: 429, rateLimit: `"per-client-60s";r=1;t=60`}},
		{"/negative", response{status: 500}},
		// Neither /free nor /huge counted.
		{"/lookup", response{status: 200, rateLimit: `"per-client-60s";r=0;t=60`}},
	} {
		r := httptest.NewRequest(http.MethodGet, s.path, nil)
		r.RemoteAddr = "203.0.113.9:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := responseOf(w); got != s.want {
			t.Errorf("step %d %s:\n got %v\nwant %v", i, s.path, got, s.want)
		}
	}
	var got error
	onError := WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) { got = err; w.WriteHeader(418) })
	r := httptest.NewRequest(http.MethodGet, "/negative", nil)
	handler(t, b, cost, onError).ServeHTTP(httptest.NewRecorder(), r)
	if !errors.Is(got, ErrCost) {
		t.Errorf("cost -1: %v, want ErrCost", got)
	}
}

// Without a resource, each ServeMux pattern counts apart; the middleware
// wrapped around the mux itself finds no pattern and refuses.
func TestResourceFromPattern(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(2)))
	mw, err := New(b, "")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	var seen string
	mux.Handle("GET /items/{id}", mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		res, _ := ResultFrom(r.Context())
		seen = r.Pattern + " " + res.Rules[0].Rule.String()
	})))
	mux.Handle("GET /users/{id}", mw(ok))
	for i, s := range []struct{ path, want string }{
		{"/items/1", `"per-client-60s";r=1;t=60`},
		{"/items/2", `"per-client-60s";r=0;t=60`}, // one route, whatever the id
		{"/users/1", `"per-client-60s";r=1;t=60`},
	} {
		w := get2(mux, s.path)
		if got := w.Result().Header.Get("RateLimit"); w.Code != 200 || got != s.want {
			t.Errorf("step %d %s: %d %s, want 200 %s", i, s.path, w.Code, got, s.want)
		}
	}
	if seen != "GET /items/{id} per-client 2 per 1m0s" {
		t.Errorf("handler saw %q", seen)
	}
	if w := get2(mw(mux), "/items/1"); w.Code != http.StatusInternalServerError {
		t.Errorf("around the mux: %d, want 500 (ErrNoPattern)", w.Code)
	}
}

// get2 serves GET path from 203.0.113.9 through h.
func get2(h http.Handler, path string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.RemoteAddr = "203.0.113.9:1"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// IPv6 addresses are keyed by their /64 (or the prefix of WithIPv6Prefix),
// IPv4 ones one by one, other keys as they are.
func TestGroupIPv6(t *testing.T) {
	for _, c := range []struct {
		key  string
		bits int
		want string
	}{
		{"ip:2001:db8:1:2:3:4:5:6", 64, "ip:2001:db8:1:2::/64"},
		{"ip:2001:db8:1:2:3:4:5:6", 48, "ip:2001:db8:1::/48"},
		{"ip:2001:db8:1:2:3:4:5:6", 128, "ip:2001:db8:1:2:3:4:5:6"},
		{"ip:2001:db8::1", 0, "ip:::/0"},
		{"ip:203.0.113.9", 64, "ip:203.0.113.9"},
		{"ip:fe80::1%eth0", 64, "ip:fe80::/64"},
		{"ip:not-an-address", 64, "ip:not-an-address"},
		{"X-Api-Key:abc", 64, "X-Api-Key:abc"},
	} {
		if got := groupIPv6(c.key, c.bits); got != c.want {
			t.Errorf("groupIPv6(%q, %d) = %q, want %q", c.key, c.bits, got, c.want)
		}
	}
}

// On the real Redis: two addresses of one /64 share a count, another /64
// has its own, and WithIPv6Prefix(128) counts each address apart.
func TestIPv6GroupedOnRedis(t *testing.T) {
	rdb, prefix := realClient(t)
	b := bucket(t, rdb, leakybucket.WithPrefix(prefix), leakybucket.PerClient(leakybucket.PerMinute(3)))
	h := handler(t, b)
	remaining := func(h http.Handler, addr string) string {
		w := get(h, "["+addr+"]:4711")
		r, _, _ := strings.Cut(responseOf(w).rateLimit, ";t=")
		return r
	}
	for i, s := range []struct{ addr, want string }{
		{"2001:db8:1:2::1", `"per-client-60s";r=2`},
		{"2001:db8:1:2:ffff::9", `"per-client-60s";r=1`}, // the same /64
		{"2001:db8:1:3::1", `"per-client-60s";r=2`},      // another /64
	} {
		if got := remaining(h, s.addr); got != s.want {
			t.Errorf("step %d %s: %s, want %s", i, s.addr, got, s.want)
		}
	}
	each := handler(t, b, WithIPv6Prefix(128))
	if got := remaining(each, "2001:db8:1:2::2"); got != `"per-client-60s";r=2` {
		t.Errorf("/128: %s, want r=2", got)
	}
}

// WithProblemDetails answers the draft's quota-exceeded problem, naming
// the policies that denied.
func TestProblemDetails(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.Per(1, 10*time.Second)))
	h := handler(t, b, WithProblemDetails())
	get(h, "203.0.113.9:1")
	w := get(h, "203.0.113.9:1")
	want := `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",` +
		`"title":"Request cannot be satisfied as assigned quota has been exceeded",` +
		`"status":429,"detail":"retry after 10 s","violated-policies":["per-client-10s"]}` + "\n"
	if w.Code != 429 || w.Body.String() != want || w.Result().Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%d %s %q\nwant 429 application/problem+json %q", w.Code, w.Result().Header.Get("Content-Type"), w.Body, want)
	}
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Error(err)
	}
	if got := DeniedPolicies(context.Background()); got != nil {
		t.Errorf("DeniedPolicies outside the middleware: %q", got)
	}
	if got := DefaultPolicyNames(b.Rules()); len(got) != 2 || got[0] != "per-resource-60s" || got[1] != "per-client-10s" {
		t.Errorf("DefaultPolicyNames = %q", got)
	}
}

// WithoutResourcePolicies leaves per-resource rules out of every field,
// the -06 trio included; they still deny, with Retry-After.
func TestWithoutResourcePolicies(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(2)), leakybucket.PerClient(leakybucket.Per(5, 10*time.Second)))
	h := handler(t, b, WithoutResourcePolicies(), WithLegacyHeaders())
	for i, want := range []response{
		{200, `"per-client-10s";r=4;t=10`, "", "5", "4", "10"},
		{200, `"per-client-10s";r=3;t=10`, "", "5", "3", "10"},
		{429, `"per-client-10s";r=3`, "60", "5", "3", "60"},
	} {
		w := get(h, "203.0.113.9:1")
		if got := responseOf(w); got != want {
			t.Errorf("step %d:\n got %v\nwant %v", i, got, want)
		}
		if got := w.Result().Header.Get("RateLimit-Policy"); got != `"per-client-10s";q=5;w=10` {
			t.Errorf("step %d: RateLimit-Policy %s", i, got)
		}
	}
	only := handler(t, bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(1))), WithoutResourcePolicies(), WithLegacyHeaders())
	get(only, "203.0.113.9:1")
	if got := responseOf(get(only, "203.0.113.9:1")); got != (response{status: 429, retryAfter: "60"}) {
		t.Errorf("no policy shown: %v, want 429 with Retry-After only", got)
	}
}

// Fields gives other servers of a Bucket the values the middleware writes
// with the default names.
func TestFields(t *testing.T) {
	rdb, mr := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.Per(1, 10*time.Second)))
	ctx := context.Background()
	type fields struct{ policy, rateLimit, retry string }
	const policy = `"per-resource-60s";q=100;w=60, "per-client-10s";q=1;w=10`
	for i, want := range []fields{
		{policy, `"per-resource-60s";r=99;t=60, "per-client-10s";r=0;t=10`, ""},
		{policy, `"per-resource-60s";r=99, "per-client-10s";r=0;t=8`, "8"},
	} {
		res, err := b.Allow(ctx, "GET /", "c")
		if err != nil {
			t.Fatal(err)
		}
		var got fields
		got.policy, got.rateLimit, got.retry = Fields(res)
		if got != want {
			t.Errorf("step %d: Fields = %q, want %q", i, got, want)
		}
		mr.SetTime(start.Add(2 * time.Second))
	}
	if p, r, ra := Fields(leakybucket.Result{}); p != "" || r != "" || ra != "" {
		t.Errorf("Fields of the zero Result = %q %q %q, want empty", p, r, ra)
	}
}

// Under Windows a call counts from the end of its interval, so t may
// exceed w, and is still true: the quota is all back at t, not before.
func TestWindowsTIsTrue(t *testing.T) {
	rdb, mr := miniClient(t)
	b := bucket(t, rdb, leakybucket.WithStrategy(leakybucket.Windows(time.Second)), leakybucket.PerClient(leakybucket.Per(5, 10*time.Second)))
	h := handler(t, b)
	for i, s := range []struct {
		after time.Duration // since start
		want  string
	}{
		// Counted at the end of its interval, 0.999s, gone at 10.999s: in
		// 10.699s, rounded up.
		{300 * time.Millisecond, `"per-client-10s";r=4;t=11`},
		// 10.2s after the first call, more than w, it still counts: t=10
		// would have been false.
		{10500 * time.Millisecond, `"per-client-10s";r=3;t=11`},
		// It left; the 2nd and 3rd count, 3 left. This Bucket saw the
		// client far from its limit, so the call is decided on the totals
		// of the epochs (10 s each) its window reaches, which still hold
		// the first call: admitted as the count admits it, with a
		// Remaining of 2, a bound that is never above the exact 3 (see
		// leakybucket.Result). t is exact.
		{11500 * time.Millisecond, `"per-client-10s";r=2;t=11`},
	} {
		mr.SetTime(start.Add(s.after))
		if got := responseOf(get(h, "203.0.113.9:1")).rateLimit; got != s.want {
			t.Errorf("step %d at %v: RateLimit %s, want %s", i, s.after, got, s.want)
		}
	}
}
