package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/httplimit"
	"github.com/redis/go-redis/v9"
)

// Each API key (else each client IP, behind a proxy at 10.0.0.1) may call
// GET /search 3 times per 10 seconds.
func Example() {
	// An in-memory Redis whose clock stands still, so that the headers
	// print the same on every run: pass New your own client.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.Per(3, 10*time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httplimit.New(limiter, "GET /search",
		httplimit.WithKey(httplimit.Header("X-API-Key",
			httplimit.XForwardedFor(netip.MustParsePrefix("10.0.0.1/32")))))
	if err != nil {
		log.Fatal(err)
	}
	search := limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "results\n")
	}))

	for range 4 {
		r := httptest.NewRequest(http.MethodGet, "/search?q=redis", nil)
		r.Header.Set("X-API-Key", "key-42")
		w := httptest.NewRecorder()
		search.ServeHTTP(w, r)
		fmt.Println(w.Code, "RateLimit:", w.Header().Get("RateLimit"))
		if retry := w.Header().Get("Retry-After"); retry != "" {
			fmt.Println("    Retry-After:", retry)
		}
	}
	// Output:
	// 200 RateLimit: "per-client-10s";r=2;t=10
	// 200 RateLimit: "per-client-10s";r=1;t=10
	// 200 RateLimit: "per-client-10s";r=0;t=10
	// 429 RateLimit: "per-client-10s";r=0;t=10
	//     Retry-After: 10
}

// Free API keys get 2 requests a minute and pro keys 5, from one
// middleware; health checks are not counted, and an export costs 2.
func ExampleNewTiered() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	tiers, err := leakybucket.NewTiers(rdb)
	if err != nil {
		log.Fatal(err)
	}
	_ = tiers.Set("free", leakybucket.PerClient(leakybucket.PerMinute(2)))
	_ = tiers.Set("pro", leakybucket.PerClient(leakybucket.PerMinute(5)))
	tierOf := func(r *http.Request) (string, error) {
		if r.Header.Get("X-Plan") == "pro" { // set by the authentication in front
			return "pro", nil
		}
		return "free", nil
	}
	limit, err := httplimit.NewTiered(tiers, tierOf, "", // "": the ServeMux pattern
		httplimit.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		httplimit.WithCost(func(r *http.Request) int {
			if r.URL.Path == "/export" {
				return 2
			}
			return 1
		}))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", limit(http.NotFoundHandler()))
	mux.Handle("GET /export", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})))

	for _, c := range []struct{ path, plan string }{
		{"/healthz", ""}, {"/export", ""}, {"/export", ""}, {"/export", "pro"},
	} {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		r.Header.Set("X-Plan", c.plan)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%s %q: %d RateLimit: %s", c.path, c.plan, w.Code, w.Header().Get("RateLimit"))))
	}
	// Output:
	// /healthz "": 404 RateLimit:
	// /export "": 200 RateLimit: "per-client-60s";r=0;t=60
	// /export "": 429 RateLimit: "per-client-60s";r=0;t=60
	// /export "pro": 200 RateLimit: "per-client-60s";r=1;t=60
}

// A search costs 1, an export 4, a status page 0 (served uncounted, with
// the fields as they stand), and a full dump 50: more than the quota of
// 10, so it can never pass, and is answered 429 without Retry-After.
func ExampleWithCost() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	if err != nil {
		log.Fatal(err)
	}
	costs := map[string]int{"/search": 1, "/export": 4, "/status": 0, "/dump": 50}
	limit, err := httplimit.New(limiter, "api",
		httplimit.WithCost(func(r *http.Request) int { return costs[r.URL.Path] }))
	if err != nil {
		log.Fatal(err)
	}
	api := limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))

	for _, path := range []string{"/export", "/status", "/dump", "/search"} {
		w := httptest.NewRecorder()
		api.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Printf("%s: %d RateLimit: %s Retry-After: %q\n", path, w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
		if w.Code == http.StatusTooManyRequests {
			fmt.Print("    ", w.Body.String())
		}
	}
	// Output:
	// /export: 200 RateLimit: "per-client-60s";r=6;t=60 Retry-After: ""
	// /status: 200 RateLimit: "per-client-60s";r=6;t=60 Retry-After: ""
	// /dump: 429 RateLimit: "per-client-60s";r=6;t=60 Retry-After: ""
	//     429 too many requests: the request costs more than the quota: it can never be served
	// /search: 200 RateLimit: "per-client-60s";r=5;t=60 Retry-After: ""
}

// A new limit of 3 a minute, tried out before it is enforced: every
// request is served, with the fields the limit would send, and the
// handler (or the Bucket's observer, for metrics) sees what it would
// have denied.
func ExampleWithShadow() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(3)),
		leakybucket.WithObserver(func(_ context.Context, d leakybucket.Decision) {
			if !d.Allowed && d.Shadow {
				fmt.Println("    observer: would deny", d.Client)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httplimit.New(limiter, "GET /search", httplimit.WithShadow())
	if err != nil {
		log.Fatal(err)
	}
	search := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if res, ok := httplimit.ResultFrom(r.Context()); ok && !res.Allowed {
			fmt.Println("    handler: would deny, by", httplimit.DeniedPolicies(r.Context()))
		}
	}))

	for range 4 {
		w := httptest.NewRecorder()
		search.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/search", nil))
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "per-client-60s";r=2;t=60 Retry-After: ""
	// 200 RateLimit: "per-client-60s";r=1;t=60 Retry-After: ""
	// 200 RateLimit: "per-client-60s";r=0;t=60 Retry-After: ""
	//     observer: would deny ip:192.0.2.1
	//     handler: would deny, by [per-client-60s]
	// 200 RateLimit: "per-client-60s";r=0;t=60 Retry-After: "60"
}
