package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Observability. WithObserver gives the Bucket a function that hears every
// call of AllowN, PeekN, Flush and FlushAll (Allow and Peek included) once
// it has decided: what was asked, what was answered, how long it took and,
// for an error, what kind it was. The OpenTelemetry adapter
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

// An Op names the method a Decision reports on.
type Op uint8

const (
	// OpAllow is Allow and AllowN.
	OpAllow Op = iota + 1
	// OpPeek is Peek and PeekN.
	OpPeek
	// OpFlush is Flush.
	OpFlush
	// OpFlushAll is FlushAll.
	OpFlushAll
)

// String returns "allow", "peek", "flush" or "flush_all".
func (o Op) String() string {
	switch o {
	case OpAllow:
		return "allow"
	case OpPeek:
		return "peek"
	case OpFlush:
		return "flush"
	case OpFlushAll:
		return "flush_all"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// An ErrorKind sorts the errors of the Bucket's methods into the few
// classes that call for different action. Each class is a test with
// errors.Is on the error (see Kind), so the same error always gets the
// same kind.
type ErrorKind uint8

const (
	// ErrorNone: the call succeeded (a denial is not an error).
	ErrorNone ErrorKind = iota
	// ErrorInvalidInput: ErrEmptyResource, ErrEmptyClient or
	// ErrInvalidWeight; nothing was sent to Redis. A bug of the caller.
	ErrorInvalidInput
	// ErrorLockNotObtained: ErrLockNotObtained, real contention for the
	// lock until the context ended.
	ErrorLockNotObtained
	// ErrorUnavailable: ErrUnavailable, Redis could not be reached or did
	// not answer (also when the context ended right after).
	ErrorUnavailable
	// ErrorDeadline: the context ended (context.DeadlineExceeded or
	// context.Canceled) while Redis was slow to answer, or before a
	// decision could finish.
	ErrorDeadline
	// ErrorOther: anything else, such as ErrLockExpired or a Redis error
	// (NOPERM, LOADING, MOVED).
	ErrorOther
)

// String returns "none", "invalid_input", "lock_not_obtained",
// "unavailable", "deadline" or "other": short, fixed names, fit for a
// metric attribute.
func (k ErrorKind) String() string {
	switch k {
	case ErrorNone:
		return "none"
	case ErrorInvalidInput:
		return "invalid_input"
	case ErrorLockNotObtained:
		return "lock_not_obtained"
	case ErrorUnavailable:
		return "unavailable"
	case ErrorDeadline:
		return "deadline"
	case ErrorOther:
		return "other"
	}
	return fmt.Sprintf("ErrorKind(%d)", uint8(k))
}

// Kind returns the kind of an error returned by a Bucket's method. The
// tests run in the order of the constants, so that an ErrLockNotObtained
// or ErrUnavailable joined with the context's error keeps its own kind.
func Kind(err error) ErrorKind {
	switch {
	case err == nil:
		return ErrorNone
	case errors.Is(err, ErrEmptyResource), errors.Is(err, ErrEmptyClient), errors.Is(err, ErrInvalidWeight):
		return ErrorInvalidInput
	case errors.Is(err, ErrLockNotObtained):
		return ErrorLockNotObtained
	case errors.Is(err, ErrUnavailable):
		return ErrorUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return ErrorDeadline
	}
	return ErrorOther
}

// A Decision reports one call of a Bucket's method to its observer (see
// WithObserver).
type Decision struct {
	// Op is the method called.
	Op Op

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

	// ErrKind is Kind(Err).
	ErrKind ErrorKind

	// Err is the error the method returned, or nil.
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
// results, it runs once they are final; it first lets the breaker settle
// the error (see breaker.go).
func (b *Bucket) observe(ctx context.Context, start time.Time, op Op, resource, client string, n int, res *Result, err *error) {
	*err = b.counts.settle(ctx, resource, *err)
	if b.cfg.observer == nil {
		return
	}
	d := Decision{Op: op, Resource: resource, Client: client, N: n, Latency: time.Since(start), Err: *err}
	d.ErrKind = Kind(d.Err)
	if res != nil && d.Err == nil {
		d.Allowed, d.Fallback = res.Allowed, res.Fallback
		d.DeniedBy = slices.Clone(res.DeniedBy)
	}
	b.cfg.observer(ctx, d)
}
