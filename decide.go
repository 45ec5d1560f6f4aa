package leakybucket

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The decision path, top to bottom (docs/design.md, "Reading one
// AllowN"): AllowN checks its input and hands the call to the Bucket's
// backend. On Redis (remote.go) the call queues in its line (package
// batch); a worker takes the waiting calls as one batch and decideBatch
// asks the store (package store) to decide them, in one MULTI/EXEC
// (SortedSet, Windows) or under the lock (Logs); the store reads what each
// rule counts before each call and asks evaluate, which evaluates the
// rules (result.go) and returns its verdict; the store then records the
// admitted calls (or keeps them, and takes the denied ones back), and once
// it returns, answer gives each caller its Result. In process
// (local.go), the call is decided under one shard's lock of the counts
// (package memorystore), judged as on Redis. A call heavier than a rule's
// Requests goes to neither: look judges it on one read, as PeekN does.

// Allow is shorthand for AllowN(ctx, resource, client, 1).
func (b *Bucket) Allow(ctx context.Context, resource, client string) (Result, error) {
	return b.AllowN(ctx, resource, client, 1)
}

// AllowN admits a request of weight n by client to resource if every rule
// has room for n more, and then records it under every rule; a denied
// request is recorded nowhere (unless WithRecordDenied). A denial is a
// Result with Allowed false, not an error. A weight above the Requests of
// a rule is denied too, with RetryAfter Never: it is judged on what the
// rules count now, as PeekN judges, and recorded nowhere. The client may
// be empty only if every rule is per-resource.
//
// Concurrent calls of one Bucket to a resource are decided together, in
// arrival order. AllowN returns by ctx's deadline whatever Redis does.
//
// Errors, to match with errors.Is: ErrEmptyResource, ErrEmptyClient or
// ErrInvalidWeight (n below 1) for bad input (nothing is sent); ErrUnavailable, with
// its cause, if Redis could not be reached; under Logs, ErrLockNotObtained
// if another holder kept the lock until ctx ended, and ErrLockExpired if
// the lock expired before the write; ctx's error if it ended while Redis
// was slow; or a Redis error, wrapped. With an error nothing was recorded,
// except that a call whose write was under way may have been counted
// (never admitted uncounted). docs/api.md says more.
func (b *Bucket) AllowN(ctx context.Context, resource, client string, n int) (Result, error) {
	// A Result whose address goes to the backend, an interface, lives on
	// the heap: take one from a pool, and hand its slices to the copy.
	res := results.Get().(*Result)
	err := b.AllowNInto(ctx, resource, client, n, res)
	out := *res
	*res = Result{}
	results.Put(res)
	return out, err
}

// results are AllowN's Results while they are decided.
var results = sync.Pool{New: func() any { return new(Result) }}

// AllowNInto is AllowN writing its Result into *res, reusing the room of
// res.Rules and res.DeniedBy: in process (NewLocal), a caller that keeps
// one Result per goroutine makes no allocation per decision. So a copy of
// *res made before the call shares those slices, and sees them change:
// clone what must outlive the next call. On Redis it is AllowN, whose
// round trip allocates anyway. With an error, *res is the zero Result;
// res must not be nil (ErrNilResult).
func (b *Bucket) AllowNInto(ctx context.Context, resource, client string, n int, res *Result) (err error) {
	if res == nil {
		return ErrNilResult
	}
	defer b.observe(ctx, b.observed(), opAllow, resource, client, n, res, &err)
	if err = b.check(resource, client, n); err != nil {
		*res = Result{}
		return err
	}
	if n > b.plan.maxN {
		// No wait makes room for it: a denial that must write nothing,
		// take no one's room, nor teach the denial cache or foresight
		// anything about the client's lighter calls.
		return b.look(ctx, resource, client, n, res)
	}
	return b.counts.allow(ctx, resource, client, n, ask{}, res)
}

// AllowAtMost admits as much of a request of weight n by client to
// resource as every rule has room for, and records that much under every
// rule: the same weight under each, so the rule with the least room
// decides it. Result.Admitted says how much, from 1 to n (and never more
// than the least Requests of the rules); the Result is then AllowN's for
// that weight. When some rule has no room at all, nothing is admitted nor
// recorded: the Result is AllowN's denial of weight 1, with Admitted 0 and
// RetryAfter until one unit fits. It is one decision, made on the counts
// it is recorded against, as AllowN's is (not a loop of AllowN with
// shrinking weights, between which another caller takes the room): two
// callers asking at once are never admitted more than the room between
// them. It is redis_rate's AllowAtMost: a worker draining a queue asks how
// many of its items it may send now.
//
// Its errors are AllowN's, and so is its bad input (nothing is sent). A
// Bucket made WithRecordDenied refuses it with ErrInvalidOption: what
// such a Bucket would record of a partial grant has no single meaning.
// The observer hears it as an "allow" of weight n.
func (b *Bucket) AllowAtMost(ctx context.Context, resource, client string, n int) (res Result, err error) {
	defer b.observe(ctx, b.observed(), opAllow, resource, client, n, &res, &err)
	if err = b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	if b.cfg.recordDenied {
		return Result{}, fmt.Errorf("%w: AllowAtMost on a Bucket made WithRecordDenied", ErrInvalidOption)
	}
	// No rule admits more than its Requests: the rest would be written
	// only to be taken back.
	if err = b.counts.allow(ctx, resource, client, min(n, b.plan.maxN), ask{atMost: true}, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// check refuses bad input before anything is sent. A weight above a
// rule's Requests is not bad input: AllowN and PeekN answer it with a
// denial (see Never), WaitN with an error (see fits).
func (b *Bucket) check(resource, client string, n int) error {
	switch {
	case resource == "":
		return ErrEmptyResource
	case client == "" && b.plan.HasClientRule:
		return ErrEmptyClient
	case n <= 0:
		return fmt.Errorf("%w: n = %d, want at least 1", ErrInvalidWeight, n)
	}
	return nil
}

// fits refuses a weight that no wait would ever admit: WaitN's answer to
// what AllowN denies with RetryAfter Never.
func (b *Bucket) fits(n int) error {
	if n > b.plan.maxN {
		return fmt.Errorf("%w: n = %d exceeds the %d requests of a rule, so it could never be admitted", ErrInvalidWeight, n, b.plan.maxN)
	}
	return nil
}

// Peek is shorthand for PeekN(ctx, resource, client, 1).
func (b *Bucket) Peek(ctx context.Context, resource, client string) (Result, error) {
	return b.PeekN(ctx, resource, client, 1)
}

// PeekN returns what AllowN would answer now, recording nothing: Remaining
// is what would be left after the call (a weight above a rule's Requests:
// a denial with RetryAfter Never, as AllowN's). It takes no lock, so a
// decision under way elsewhere may be missed. It costs one round trip
// (Logs: when the SCAN fits in one page).
func (b *Bucket) PeekN(ctx context.Context, resource, client string, n int) (res Result, err error) {
	defer b.observe(ctx, b.observed(), opPeek, resource, client, n, &res, &err)
	if err = b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	err = b.look(ctx, resource, client, n, &res)
	return res, err
}

// look judges a call of weight n by what every rule counts now, writing
// nothing, into res (the zero Result with an error): PeekN, and AllowN of
// a call that can never be admitted. A call heavier than every rule reads
// as one of the largest Requests: no rule reads further for it.
func (b *Bucket) look(ctx context.Context, resource, client string, n int, res *Result) error {
	rd, err := b.counts.read(ctx, resource, client, min(n, b.plan.largest))
	if err != nil {
		*res = Result{}
		return err
	}
	rd.plan.evaluateInto(res, rd.View, n, b.cfg.recordDenied)
	return nil
}

// Usage returns what each rule counts for client at resource now, in the
// order of the rules, recording nothing: Used, Remaining and ResetAfter as
// they are, without a call, and RetryAfter as for a call of weight 1. For
// dashboards and operators; to ask about a call, use PeekN. It costs one
// round trip, as PeekN does.
func (b *Bucket) Usage(ctx context.Context, resource, client string) ([]RuleResult, error) {
	if err := b.check(resource, client, 1); err != nil {
		return nil, err
	}
	rd, err := b.counts.read(ctx, resource, client, 1)
	if err != nil {
		return nil, err
	}
	now, one := rd.plan.evaluate(rd.View, 0, false), rd.plan.evaluate(rd.View, 1, false)
	for i := range now.Rules {
		now.Rules[i].RetryAfter = one.Rules[i].RetryAfter
	}
	return now.Rules, nil
}

// Observability. WithObserver gives the Bucket a function that hears every
// call of AllowN, AllowAtMost, PeekN, Flush and FlushAll (Allow and Peek included) once
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
	// Op is the method called: "allow" (Allow, AllowN and AllowAtMost),
	// "peek" (Peek and PeekN), "flush" (Flush) or "flush_all" (FlushAll).
	// Short, fixed names, fit for a metric attribute, as net.OpError's Op
	// is.
	Op string

	// Resource and Client are the call's arguments (Client is empty for
	// FlushAll). They may be of unbounded cardinality (user IDs, API
	// keys): do not make them metric attributes without bounding them.
	Resource, Client string

	// N is the weight asked for: n of AllowN, AllowAtMost and PeekN, 1 for
	// Allow and Peek, 0 for Flush and FlushAll.
	N int

	// Allowed is Result.Allowed of AllowN, AllowAtMost and PeekN (of
	// AllowAtMost: some of N was admitted); false for Flush and
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

	// Shadow is true for a call made with a context of ContextWithShadow:
	// a middleware in shadow mode (httplimit.WithShadow,
	// grpclimit.WithShadow) asked, and serves the request whatever the
	// answer. The call was decided and counted as any other.
	Shadow bool
}

type shadowKey struct{}

// ContextWithShadow returns a copy of ctx that marks the calls made with
// it as made in shadow mode, for the observer: the Bucket decides and
// counts them as any other, and reports them with Decision.Shadow set,
// so that metrics can tell a limit being tried out from one enforced.
// httplimit.WithShadow and grpclimit.WithShadow mark their decisions so.
func ContextWithShadow(ctx context.Context) context.Context {
	return context.WithValue(ctx, shadowKey{}, true)
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
	d.Shadow, _ = ctx.Value(shadowKey{}).(bool)
	if res != nil && d.Err == nil {
		d.Allowed, d.Fallback = res.Allowed, res.Fallback
		d.DeniedBy = slices.Clone(res.DeniedBy)
	}
	b.cfg.observer(ctx, d)
}
