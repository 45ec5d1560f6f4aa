package leakybucket

import (
	"fmt"
	"time"
)

// A Limit admits at most Requests (in weight: AllowN counts n) in any sliding
// window of length Window. Windows are kept in whole milliseconds, the
// resolution of Redis expiry; a fraction of a millisecond is dropped.
type Limit struct {
	// Requests is the most weight admitted in one window; at least 1.
	Requests int
	// Window is the length of the sliding window; at least 1ms.
	Window time.Duration
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

// String returns the limit as "10 per 1m0s".
func (l Limit) String() string {
	return fmt.Sprintf("%d per %v", l.Requests, l.Window)
}

func (l Limit) validate() error {
	if l.Requests <= 0 {
		return fmt.Errorf("%w: %v: requests must be positive", ErrInvalidLimit, l)
	}
	if l.Window < time.Millisecond {
		return fmt.Errorf("%w: %v: window must be at least 1ms", ErrInvalidLimit, l)
	}
	return nil
}

// windowMillis is the window in the unit of Redis time and expiry.
func (l Limit) windowMillis() int64 { return l.Window.Milliseconds() }

// Scope says what a rule counts.
type Scope uint8

const (
	// ScopeResource: one count per resource, shared by all its clients.
	ScopeResource Scope = iota + 1
	// ScopeClient: one count per (resource, client).
	ScopeClient
)

// String returns "per-resource" or "per-client".
func (s Scope) String() string {
	switch s {
	case ScopeResource:
		return "per-resource"
	case ScopeClient:
		return "per-client"
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// A Rule is a Limit applied per resource or per client, as added to New by
// PerResource or PerClient.
type Rule struct {
	// Scope says whether the rule counts per resource or per client.
	Scope Scope
	// Limit is what the rule admits in each of its counts.
	Limit Limit
}

// String returns the rule as "per-client 10 per 1m0s".
func (r Rule) String() string { return r.Scope.String() + " " + r.Limit.String() }
