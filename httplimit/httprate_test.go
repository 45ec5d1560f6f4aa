package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

// TestHTTPRateHeaders: WithHTTPRateHeaders sends the fields of
// go-chi/httprate. The cases are httprate's own header cases, ported from
// TestResponseHeaders in its limiter_test.go (MIT License, Copyright (c)
// 2015-present Peter Kieltyka and the go-chi authors): a limit of 5 per
// minute, 6 requests of the given increments (httplimit's costs), and
// each response's status, X-RateLimit-Limit and X-RateLimit-Remaining,
// and X-RateLimit-Reset a Unix time in the future. httprate compares the
// reset with the clock after the response, which a second's boundary
// passing meanwhile would fail; here it is compared with the clock before
// the request, the instant the reset must come after.
func TestHTTPRateHeaders(t *testing.T) {
	tests := []struct {
		name                string
		increments          []int
		respCodes           []int
		respLimitHeader     []string
		respRemainingHeader []string
	}{
		{
			name:                "const increments",
			increments:          []int{1, 1, 1, 1, 1, 1},
			respCodes:           []int{200, 200, 200, 200, 200, 429},
			respLimitHeader:     []string{"5", "5", "5", "5", "5", "5"},
			respRemainingHeader: []string{"4", "3", "2", "1", "0", "0"},
		},
		{
			name:                "varying increments",
			increments:          []int{2, 2, 1, 2, 10, 1},
			respCodes:           []int{200, 200, 200, 429, 429, 429},
			respLimitHeader:     []string{"5", "5", "5", "5", "5", "5"},
			respRemainingHeader: []string{"3", "1", "0", "0", "0", "0"},
		},
		{
			name:                "no limit",
			increments:          []int{0, 0, 0, 0, 0, 0},
			respCodes:           []int{200, 200, 200, 200, 200, 200},
			respLimitHeader:     []string{"5", "5", "5", "5", "5", "5"},
			respRemainingHeader: []string{"5", "5", "5", "5", "5", "5"},
		},
		{
			name:                "always block",
			increments:          []int{10, 10, 10, 10, 10, 10},
			respCodes:           []int{429, 429, 429, 429, 429, 429},
			respLimitHeader:     []string{"5", "5", "5", "5", "5", "5"},
			respRemainingHeader: []string{"5", "5", "5", "5", "5", "5"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rdb, _ := miniClient(t)
			b := bucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(5)))
			i := 0
			h := handler(t, b, WithHTTPRateHeaders(), WithCost(func(*http.Request) int { return tt.increments[i] }))
			for ; i < len(tt.increments); i++ {
				before := time.Now().Unix()
				recorder := httptest.NewRecorder()
				h.ServeHTTP(recorder, httptest.NewRequest("GET", "/", nil))
				if respCode := recorder.Result().StatusCode; respCode != tt.respCodes[i] {
					t.Errorf("resp.StatusCode(%v) = %v, want %v", i, respCode, tt.respCodes[i])
				}
				headers := recorder.Result().Header
				if limit := headers.Get("X-RateLimit-Limit"); limit != tt.respLimitHeader[i] {
					t.Errorf("X-RateLimit-Limit(%v) = %v, want %v", i, limit, tt.respLimitHeader[i])
				}
				if remaining := headers.Get("X-RateLimit-Remaining"); remaining != tt.respRemainingHeader[i] {
					t.Errorf("X-RateLimit-Remaining(%v) = %v, want %v", i, remaining, tt.respRemainingHeader[i])
				}
				reset := headers.Get("X-RateLimit-Reset")
				if resetUnixTime, err := strconv.ParseInt(reset, 10, 64); err != nil || resetUnixTime <= before {
					t.Errorf("X-RateLimit-Reset(%v) = %v, want unix timestamp in the future", i, reset)
				}
			}
		})
	}
}

// TestHTTPRateValues: the values themselves, on a clock that stands
// still: X-RateLimit-Reset is when the quota is all back (60 s after the
// calls) or, on a denial, when the request may come back, as a Unix time
// rounded up; Retry-After is in seconds, as httprate sends it; and
// without the option none of the X- fields is sent.
func TestHTTPRateValues(t *testing.T) {
	rdb, _ := miniClient(t)
	b := bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(2)))
	h := handler(t, b, WithHTTPRateHeaders())
	for i, want := range []struct {
		code             int
		remaining, retry string
	}{{200, "1", ""}, {200, "0", ""}, {429, "0", "60"}} {
		before := time.Now()
		w := get(h, "203.0.113.9:1")
		after := time.Now()
		hd := w.Result().Header
		fields := hd.Get("X-RateLimit-Limit") == "2" && hd.Get("X-RateLimit-Remaining") == want.remaining && hd.Get("Retry-After") == want.retry
		if w.Code != want.code || !fields || !resetWithin(hd, before.Add(time.Minute), after.Add(time.Minute)) {
			t.Errorf("step %d: %d %v; want %d, limit 2, remaining %s, Retry-After %q, reset 60 s on, rounded up",
				i, w.Code, hd, want.code, want.remaining, want.retry)
		}
	}
	plain := get(handler(t, b), "203.0.113.10:1").Result().Header
	for _, name := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if plain.Get(name) != "" {
			t.Errorf("%s sent without WithHTTPRateHeaders", name)
		}
	}
}

// resetWithin reports whether h's X-RateLimit-Reset is a Unix time after
// from, and no later than to rounded up to the next second.
func resetWithin(h http.Header, from, to time.Time) bool {
	reset, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	return err == nil && reset > from.Unix() && reset <= to.Unix()+1
}
