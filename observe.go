package leakybucket

import (
	"context"
	"slices"
	"time"
)

// Observability. WithObserver gives the Bucket a function that hears every
// call of AllowN, PeekN, Flush and FlushAll (Allow and Peek included) once
// it has decided: what was asked, what was answered, how long it took and
// the error, if any. The OpenTelemetry adapter
// (github.com/leakybucket/leakybucket/otelmetrics, a module of its own)
// turns these Decisions into metrics; a log line or a Prometheus counter is
// a few lines more.
//
// The observer runs synchronously in the caller's goroutine, after the
// call decided and before the method returns, so its own time adds to the
// caller's latency (not to Decision.Latency): keep it fast, and hand slow
// work (a network write) to another goroutine. It cannot change the answer:
// it gets copies, DeniedBy included. A panic in it is not recovered: it
// reaches the caller of the method, as a panic in the caller's own code
// would, with the Bucket intact (the call's work is done or left to the
// background, as when a caller gives up), so the next call works as usual.
// Recovering would hide a broken observer behind missing metrics.

// The values of Decision.Op.
const (
	opAllow    = "allow"
	opPeek     = "peek"
	opFlush    = "flush"
	opFlushAll = "flush_all"
)

// A Decision reports one call of a Bucket's method to its observer (see
// WithObserver).
type Decision struct {
	// Op is the method called: "allow" (Allow and AllowN), "peek" (Peek
	// and PeekN), "flush" (Flush) or "flush_all" (FlushAll). Short, fixed
	// names, fit for a metric attribute, as net.OpError's Op is.
	Op string

	// Resource and Client are the call's arguments (Client is empty for
	// FlushAll). They may be of unbounded cardinality (user IDs, API
	// keys): do not make them metric attributes without bounding them.
	Resource, Client string

	// N is the weight asked for: n of AllowN and PeekN, 1 for Allow and
	// Peek, 0 for Flush and FlushAll.
	N int

	// Allowed is Result.Allowed of AllowN and PeekN; false for Flush and
	// FlushAll, and whenever Err is not nil.
	Allowed bool

	// DeniedBy is a copy of Result.DeniedBy: the rules that had no room,
	// in the order given to New; empty unless denied.
	DeniedBy []Rule

	// Latency is the time from the method's start to its return, the
	// observer's own time excluded.
	Latency time.Duration

	// Err is the error the method returned, or nil. Tell its kind with
	// errors.Is, as for the method's own error: ErrUnavailable,
	// ErrLockNotObtained, context.DeadlineExceeded and so on.
	Err error

	// Fallback is Result.Fallback of AllowN and PeekN: the call was
	// decided in this process because Redis was unreachable (see
	// WithFallback). Its switch from false to true and back is the
	// Bucket's switch to its fallback and back to Redis, for the
	// resource's server. False for Flush and FlushAll, and whenever Err is
	// not nil.
	Fallback bool
}

// observed is when a call began, or the zero time if the Bucket has no
// observer, so that a Bucket without one never reads the clock for it.
func (b *Bucket) observed() time.Time {
	if b.cfg.observer == nil {
		return time.Time{}
	}
	return time.Now()
}

// observe reports a call that began at start (see observed) to the
// observer, if any. Deferred by the methods with pointers to their named
// results, it runs once they are final; it first lets the breaker have its say on
// the error (see breaker.go).
func (b *Bucket) observe(ctx context.Context, start time.Time, op, resource, client string, n int, res *Result, err *error) {
	*err = b.counts.finalError(ctx, resource, *err)
	if b.cfg.observer == nil {
		return
	}
	d := Decision{Op: op, Resource: resource, Client: client, N: n, Latency: time.Since(start), Err: *err}
	if res != nil && d.Err == nil {
		d.Allowed, d.Fallback = res.Allowed, res.Fallback
		d.DeniedBy = slices.Clone(res.DeniedBy)
	}
	b.cfg.observer(ctx, d)
}
