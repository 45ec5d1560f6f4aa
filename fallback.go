package leakybucket

import (
	"context"
	"errors"
)

// The fallback (WithFallback): a Bucket's calls go to Redis while the
// breaker of their server is closed, and are decided in process, by each
// rule's share, while it is open.

// fallback is the backend of a Bucket made WithFallback: the counts in
// Redis, and the shares' counts in process for when Redis is unreachable.
type fallback struct {
	*remote
	local *localCounts
}

// newFallback returns the backend of a Bucket of cfg WithFallback, on r.
func newFallback(cfg config, r *remote) (*fallback, error) {
	local, err := newLocalCounts(cfg.strategy, sharesOf(cfg))
	if err != nil {
		return nil, err
	}
	return &fallback{remote: r, local: local}, nil
}

// sharesOf returns the plan of cfg's fallback: each rule's Requests
// divided by the instances, rounded down, so that the instances together
// never admit more than the rule.
func sharesOf(cfg config) plan {
	shared := cfg
	shared.rules = make([]Rule, len(cfg.rules))
	for i, r := range cfg.rules {
		r.Limit.Requests /= cfg.instances
		r.Limit.Burst /= cfg.instances
		shared.rules[i] = r
	}
	p := newPlan(shared)
	p.fallback = true
	return p
}

// allow decides a call on Redis, or in process if Redis is unreachable:
// the breaker refused the call or cut it, or the call found the server
// gone. A call decided on Redis lets the process's counts free what left
// their windows, so that an outage's clients do not outlive it there.
func (f *fallback) allow(ctx context.Context, resource, client string, n int, how ask, res *Result) error {
	err := f.remote.allow(ctx, resource, client, n, how, res)
	if !f.down(ctx, resource, err) {
		if err == nil {
			f.local.counts.Sweep()
		}
		return err
	}
	return f.local.allow(ctx, resource, client, n, how, res)
}

// refund gives back on Redis what Redis admitted, and in process what the
// fallback admitted (Result.Fallback).
func (f *fallback) refund(ctx context.Context, a *Admission, n int) (int, error) {
	if a.fallback {
		return f.local.refund(ctx, a, n)
	}
	return f.remote.refund(ctx, a, n)
}

// generation reads it on Redis, or in process if Redis is unreachable: a
// call then decided by the other is refunded by the other, whose
// generation differs, and gets nothing back (never too much).
func (f *fallback) generation(ctx context.Context, resource string) (string, error) {
	gen, err := f.remote.generation(ctx, resource)
	if !f.down(ctx, resource, err) {
		return gen, err
	}
	return f.local.generation(ctx, resource)
}

// read reads on Redis, or in process if Redis is unreachable.
func (f *fallback) read(ctx context.Context, resource, client string, n int) (reading, error) {
	rd, err := f.remote.read(ctx, resource, client, n)
	if !f.down(ctx, resource, err) {
		return rd, err
	}
	return f.local.read(ctx, resource, client, n)
}

// flush forgets client's counts in process and on Redis: an error says
// that Redis's are left.
func (f *fallback) flush(ctx context.Context, resource, client string) error {
	if err := f.local.flush(ctx, resource, client); err != nil {
		return err
	}
	return f.remote.flush(ctx, resource, client)
}

// flushAll forgets every count of resource in process and on Redis.
func (f *fallback) flushAll(ctx context.Context, resource string) error {
	if err := f.local.flushAll(ctx, resource); err != nil {
		return err
	}
	return f.remote.flushAll(ctx, resource)
}

// down reports whether a call at resource that ended with err on Redis
// is the fallback's to decide: its server is unreachable (see gone), or
// its decision's replicas did not acknowledge it (WithReplicas), which
// admitted nothing on Redis and took its writes back. Not a call whose
// context has ended: it is decided nowhere.
func (f *fallback) down(ctx context.Context, resource string, err error) bool {
	return err != nil && ctx.Err() == nil && (errors.Is(err, ErrNotReplicated) || f.remote.gone(ctx, resource, err))
}
