package leakybucket

import (
	"fmt"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// A Limit admits at most Requests (in weight: AllowN counts n) in any sliding
// window of length Window; or, under FixedWindows without a Precision, in
// each fixed window. Windows are kept in whole milliseconds, the resolution
// of Redis expiry; a fraction of a millisecond is dropped.
//
// Under the Windows strategies a Limit is counted in intervals of
// Precision: a sliding window that may deny for up to Precision longer than
// an exact one, and never admits more. A Limit without a Precision takes
// the strategy's (Windows(p)); under FixedWindows, which has none, it is a
// fixed window: it counts from each multiple of Window since the Unix
// epoch, in Redis time, and starts again from zero at the next.
type Limit struct {
	// Requests is the most weight admitted in one window; at least 1.
	Requests int
	// Window is the length of the window; at least 1ms.
	Window time.Duration
	// Precision is the length of the intervals the Windows strategies
	// count this Limit in: at least 1ms, at most Window, and
	// Window/Precision at most 2^22 (4 194 304). Zero: the strategy's. The
	// other strategies are exact and refuse a Precision.
	Precision time.Duration
	// Burst is, under GCRA, the most weight the rule's bucket holds, which
	// drains at Requests per Window: at least 1, and at most the weight
	// admitted at once. Zero: Requests. The other strategies count in
	// windows and refuse a Burst.
	Burst int
}

// Per returns a Limit of requests per window.
func Per(requests int, window time.Duration) Limit {
	return Limit{Requests: requests, Window: window}
}

// PerSecond returns a Limit of n requests per second.
func PerSecond(n int) Limit { return Per(n, time.Second) }

// PerMinute returns a Limit of n requests per minute.
func PerMinute(n int) Limit { return Per(n, time.Minute) }

// PerHour returns a Limit of n requests per hour.
func PerHour(n int) Limit { return Per(n, time.Hour) }

// WithPrecision returns l counted, under the Windows strategies, in
// intervals of precision: PerHour(100).WithPrecision(time.Minute) admits
// 100 in any sliding hour, counted by the minute, so that room comes back
// up to a minute late and the count takes at most 61 fields.
func (l Limit) WithPrecision(precision time.Duration) Limit {
	l.Precision = precision
	return l
}

// WithBurst returns l with a burst, under GCRA: Per(10,
// time.Second).WithBurst(50) drains 10 a second, one every 100ms, and
// admits up to 50 at once from an empty bucket.
func (l Limit) WithBurst(burst int) Limit {
	l.Burst = burst
	return l
}

// String returns the limit as "10 per 1m0s", with a precision as "10
// per 1h0m0s (precision 1m0s)", or with a burst as "10 per 1s (burst 50)".
func (l Limit) String() string {
	if l.Burst != 0 {
		return fmt.Sprintf("%d per %v (burst %d)", l.Requests, l.Window, l.Burst)
	}
	if l.Precision != 0 {
		return fmt.Sprintf("%d per %v (precision %v)", l.Requests, l.Window, l.Precision)
	}
	return fmt.Sprintf("%d per %v", l.Requests, l.Window)
}

// maxIntervals bounds Window/Precision under the Windows strategy: a
// decision reads every interval of its hash that holds a call, up to one
// per precision of the longest window, so past a few million a busy key
// costs Redis more per decision than a deadline allows. It admits an hour
// at a precision of 1ms and 48 days at 1s.
const maxIntervals = 1 << 22

func (l Limit) validate() error {
	if l.Requests <= 0 {
		return fmt.Errorf("%w: limit %v: requests must be positive", ErrInvalidOption, l)
	}
	if l.Window < time.Millisecond {
		return fmt.Errorf("%w: limit %v: window must be at least 1ms", ErrInvalidOption, l)
	}
	if l.Burst < 0 {
		return fmt.Errorf("%w: limit %v: a negative burst", ErrInvalidOption, l)
	}
	if l.Precision != 0 {
		if err := checkPrecision(l.Precision, l.Window); err != nil {
			return fmt.Errorf("%w: limit %v: %w", ErrInvalidOption, l, err)
		}
	}
	return nil
}

// checkPrecision checks intervals of precision for a window: at least 1ms,
// at most the window, and at most maxIntervals of them in it. Its error
// says what is wrong; the caller wraps it with what it checked.
func checkPrecision(precision, window time.Duration) error {
	switch {
	case precision < time.Millisecond:
		return fmt.Errorf("precision %v is under 1ms", precision)
	case precision > window:
		return fmt.Errorf("precision %v is longer than the window %v", precision, window)
	case window.Milliseconds()/precision.Milliseconds() > maxIntervals:
		return fmt.Errorf("window %v is more than maxIntervals (%d) intervals of precision %v", window, maxIntervals, precision)
	}
	return nil
}

// windowMillis is the window in the unit of Redis time and expiry.
func (l Limit) windowMillis() int64 { return l.Window.Milliseconds() }

// A Rule is a Limit applied per resource or per client, as added to New by
// PerResource or PerClient.
type Rule struct {
	// PerClient says what the rule counts: a count of its own for each
	// client of a resource (PerClient), or, if false, one count for the
	// whole resource, shared by all its clients (PerResource).
	PerClient bool
	// Limit is what the rule admits in each of its counts.
	Limit Limit
}

// model is r as the counts judge it: with a burst (GCRA), what it holds
// is the burst, drained at Requests per Window.
func (r Rule) model() limits.Rule {
	m := limits.Rule{PerClient: r.PerClient, Requests: r.Limit.Requests,
		Window: r.Limit.windowMillis(), Precision: r.Limit.Precision.Milliseconds()}
	if r.Limit.Burst != 0 {
		m.Requests, m.Rate = r.Limit.Burst, r.Limit.Requests
	}
	return m
}

// String returns the rule as "per-client 10 per 1m0s" or "per-resource 100
// per 30m0s".
func (r Rule) String() string {
	if r.PerClient {
		return "per-client " + r.Limit.String()
	}
	return "per-resource " + r.Limit.String()
}
