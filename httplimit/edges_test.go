package httplimit

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/leakybucket/leakybucket"
)

// TestNeverFittingKeepsT: a request that can never fit (its cost above
// the client's quota) is denied without Retry-After, and each policy whose
// quota is in use still says when it resets: t on every RateLimit item
// that will reset, none on one that counts nothing.
func TestNeverFittingKeepsT(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.PerMinute(10)))
	h := handler(t, b, WithCost(costPaths))
	for i, s := range []struct {
		path, remote string
		want         response
	}{
		{"/huge", "203.0.113.9:1", response{status: 429, rateLimit: `"per-resource-60s";r=100, "per-client-60s";r=10`}}, // nothing used: nothing resets
		{"/export", "203.0.113.9:1", response{status: 200, rateLimit: `"per-resource-60s";r=96;t=60, "per-client-60s";r=6;t=60`}},
		{"/huge", "203.0.113.9:1", response{status: 429, rateLimit: `"per-resource-60s";r=96;t=60, "per-client-60s";r=6;t=60`}},
		{"/huge", "203.0.113.10:1", response{status: 429, rateLimit: `"per-resource-60s";r=96;t=60, "per-client-60s";r=10`}}, // another client: its own quota is unused
	} {
		r := httptest.NewRequest(http.MethodGet, s.path, nil)
		r.RemoteAddr = s.remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := responseOf(w); got != s.want {
			t.Errorf("step %d %s from %s:\n got %v\nwant %v", i, s.path, s.remote, got, s.want)
		}
	}
}
