package httplimit

import (
	"context"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

// Under GCRA a policy's q is the burst and its w the time the bucket takes
// to drain a whole burst, in whole seconds or not at all, as a window's;
// a rule without a burst has its Requests as burst, and its window.
func TestGCRAPolicy(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.WithStrategy(leakybucket.GCRA),
		leakybucket.PerClient(leakybucket.Per(2, time.Second).WithBurst(4)),        // empty in 2s
		leakybucket.PerClient(leakybucket.Per(10, time.Second).WithBurst(50)),      // in 5s
		leakybucket.PerResource(leakybucket.Per(3, time.Second).WithBurst(1)),      // in 333.3ms: no w
		leakybucket.PerResource(leakybucket.Per(100, 2*time.Second).WithBurst(20)), // in 400ms: no w
		leakybucket.PerResource(leakybucket.PerMinute(100)))                        // burst 100, in 60s
	const want = `"per-client-1s";q=4;w=2, "per-client-1s-2";q=50;w=5, "per-resource-1s";q=1, "per-resource-2s";q=20, "per-resource-60s";q=100;w=60`
	if got := get(handler(t, b), "203.0.113.9:1").Result().Header.Get("RateLimit-Policy"); got != want {
		t.Errorf("RateLimit-Policy:\n got %s\nwant %s", got, want)
	}
	res, err := b.Allow(context.Background(), "GET /", "203.0.113.9")
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := Fields(res); got != want {
		t.Errorf("Fields: policy\n got %s\nwant %s", got, want)
	}
}

// Under GCRA, RateLimit's r is the whole units of burst left and t, on an
// admission, the seconds until the bucket is empty, on a denial until the
// call fits (as Retry-After); draft -06's limit is the burst. Per(2,
// time.Second).WithBurst(4) drains one every 500ms.
func TestGCRAFields(t *testing.T) {
	rdb, mr := miniClient(t)
	b := bucket(t, rdb, leakybucket.WithStrategy(leakybucket.GCRA),
		leakybucket.PerClient(leakybucket.Per(2, time.Second).WithBurst(4)))
	h := handler(t, b, WithLegacyHeaders(), WithHTTPRateHeaders())
	steps := []struct {
		after time.Duration // since start
		want  response
	}{
		{0, response{200, `"per-client-1s";r=3;t=1`, "", "4", "3", "1"}}, // empty at 500ms
		{0, response{200, `"per-client-1s";r=2;t=1`, "", "4", "2", "1"}},
		{0, response{200, `"per-client-1s";r=1;t=2`, "", "4", "1", "2"}}, // 1.5s, rounded up
		{0, response{200, `"per-client-1s";r=0;t=2`, "", "4", "0", "2"}},
		{0, response{429, `"per-client-1s";r=0;t=1`, "1", "4", "0", "1"}}, // room for one at 500ms
		// At 600ms 1.4s of drain is left, 2.8 units: room for one, rounded
		// down; then 1.9s, 3.8 units, room for none.
		{600 * time.Millisecond, response{200, `"per-client-1s";r=0;t=2`, "", "4", "0", "2"}},
		{600 * time.Millisecond, response{429, `"per-client-1s";r=0;t=1`, "1", "4", "0", "1"}}, // fits in 400ms
		{2100 * time.Millisecond, response{200, `"per-client-1s";r=2;t=1`, "", "4", "2", "1"}}, // 0.4s left, then 0.9s
	}
	for i, s := range steps {
		mr.SetTime(start.Add(s.after))
		w := get(h, "203.0.113.9:1")
		if got := responseOf(w); got != s.want {
			t.Errorf("step %d at %v:\n got %v\nwant %v", i, s.after, got, s.want)
		}
		if got := w.Result().Header.Get("X-RateLimit-Limit"); got != "4" {
			t.Errorf("step %d: X-RateLimit-Limit %q, want the burst, 4", i, got)
		}
	}
}
