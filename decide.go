package leakybucket

import (
	"context"
	"sync"
)

// The decision path, top to bottom (docs/design.md, "Reading one
// AllowN"): AllowN checks its input and hands the call to the Bucket's
// backend. On Redis (remote.go) the call queues in its line (package
// batch); a worker takes the waiting calls as one batch and decideBatch
// asks the store (package store) to decide them, in one MULTI/EXEC
// (SortedSet, Windows) or under the lock (Logs); the store reads what each
// rule counts before each call and asks judge, which evaluates the rules
// (result.go) and answers the caller; the store then records the admitted
// calls (or keeps them, and takes the denied ones back). In process
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
	return b.counts.allow(ctx, resource, client, n, res)
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
