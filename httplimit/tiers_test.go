package httplimit

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/leakybucket/leakybucket"
)

// tierHeader is the TierFunc of the tests: the X-Tier header, "free" by
// default. A real service reads an authenticated claim.
func tierHeader(r *http.Request) (string, error) {
	if tier := r.Header.Get("X-Tier"); tier != "" {
		return tier, nil
	}
	return "free", nil
}

// On the real Redis: one middleware serves two tiers; the headers
// advertise the request's tier; a client that upgrades keeps its count,
// and a limit changed at run time applies to the next request.
func TestTieredOnRedis(t *testing.T) {
	rdb, prefix := realClient(t)
	tiers, err := leakybucket.NewTiers(rdb, leakybucket.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	set := func(tier string, n int) {
		t.Helper()
		if err := tiers.Set(tier, leakybucket.PerClient(leakybucket.PerMinute(n))); err != nil {
			t.Fatal(err)
		}
	}
	set("free", 2)
	set("pro", 5)
	mw, err := NewTiered(tiers, tierHeader, "GET /")
	if err != nil {
		t.Fatal(err)
	}
	tieredSteps(t, mw(ok), set)
	tieredErrors(t, tiers)
}

// tieredSteps runs the steps of TestTieredOnRedis through h; set sets a
// tier's limit a minute.
func tieredSteps(t *testing.T, h http.Handler, set func(tier string, n int)) {
	t.Helper()
	for i, s := range []struct {
		tier, setFree string // setFree: Set free to this many a minute first
		status        int
		policy, r     string
	}{
		{"free", "", 200, `"per-client-60s";q=2;w=60`, `"per-client-60s";r=1`},
		{"free", "", 200, `"per-client-60s";q=2;w=60`, `"per-client-60s";r=0`},
		{"free", "", 429, `"per-client-60s";q=2;w=60`, `"per-client-60s";r=0`},
		{"pro", "", 200, `"per-client-60s";q=5;w=60`, `"per-client-60s";r=2`}, // counts the 2 free calls
		{"free", "4", 200, `"per-client-60s";q=4;w=60`, `"per-client-60s";r=0`},
		{"free", "", 429, `"per-client-60s";q=4;w=60`, `"per-client-60s";r=0`},
	} {
		if s.setFree != "" {
			set("free", int(s.setFree[0]-'0'))
		}
		w := get(h, "203.0.113.9:1", "X-Tier", s.tier)
		policy, rl := w.Result().Header.Get("RateLimit-Policy"), w.Result().Header.Get("RateLimit")
		if w.Code != s.status || policy != s.policy || !strings.HasPrefix(rl, s.r+";t=") {
			t.Errorf("step %d (%s): %d %s | %s; want %d %s | %s;t=...", i, s.tier, w.Code, policy, rl, s.status, s.policy, s.r)
		}
	}
}

// tieredErrors checks NewTiered's errors: an unknown tier, names that do
// not fit, nil Tiers.
func tieredErrors(t *testing.T, tiers *leakybucket.Tiers) {
	t.Helper()
	var got error
	onError := WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) { got = err; w.WriteHeader(403) })
	mw, err := NewTiered(tiers, tierHeader, "GET /", onError)
	if err != nil {
		t.Fatal(err)
	}
	if w := get(mw(ok), "203.0.113.9:1", "X-Tier", "gold"); w.Code != 403 || !errors.Is(got, ErrTier) || !errors.Is(got, leakybucket.ErrUnknownTier) {
		t.Errorf("unknown tier: %d %v, want 403, ErrTier and ErrUnknownTier", w.Code, got)
	}
	if _, err := NewTiered(tiers, tierHeader, "GET /", WithPolicyNames("a", "b")); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("two names for one rule: %v, want ErrInvalidOption", err)
	}
	if _, err := NewTiered(nil, tierHeader, "GET /"); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("nil Tiers: %v, want ErrInvalidOption", err)
	}
}
