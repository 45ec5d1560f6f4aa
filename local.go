package leakybucket

import (
	"context"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/memorystore"
	"github.com/leakybucket/leakybucket/internal/store"
)

// NewLocal returns a Bucket that keeps its counts in this process's memory
// instead of Redis: the same rules, strategies, options and methods as
// New, with the same Results for the same calls (the behaviour suite runs
// on both), for a service of one instance, for tests without a Redis, or
// to start with and move to Redis later without touching a call site.
// Its counts are this process's only: two processes with a local Bucket
// each admit up to the limit each.
//
// Time is this host's monotonic clock, read in whole milliseconds. A
// decision takes a lock of one shard of the keys (a resource's, when a
// rule is per-resource) and allocates only the Result's slices; every
// method may be called from any goroutine against any other. The state
// of a key no rule counts any more (idle for the longest window) is freed
// by a later call: a window after its newest call if it was called once,
// within two if it was called for longer. The room of a shard's map or a
// key's calls that once held four times what they hold now is given back:
// memory follows the keys used within the last two windows, also after a
// churn of millions, and no goroutine runs in the background.
// The options that concern Redis (WithPrefix, WithLockTTL, WithLockWait,
// WithScanCount, WithFallback) are accepted and change nothing.
func NewLocal(opts ...Option) (*Bucket, error) {
	cfg, p, err := configure(opts)
	if err != nil {
		return nil, err
	}
	counts, err := newLocalCounts(cfg.strategy, p)
	if err != nil {
		return nil, err
	}
	b := newBucket(cfg, p)
	b.counts = counts
	return b, nil
}

// localCounts is the backend of NewLocal: the counts in process (package
// memorystore), counted as the strategy's store would count them, and judged by
// the Bucket's plan.
type localCounts struct {
	plan
	counts localStore
	// noClientShare: Windows without a per-client rule keeps no client's
	// share of the resource's counts, so Flush cannot take it out.
	noClientShare bool
	// noClientBucket: GCRA without a per-client rule keeps no client's
	// bucket, so Flush has nothing of its own to empty.
	noClientBucket bool
}

func newLocalCounts(s Strategy, p plan) (*localCounts, error) {
	c, err := s.counting(p) // checks the rules as New does
	if err != nil {
		return nil, err
	}
	if c.tats {
		return &localCounts{plan: p, counts: memorystore.NewTATs(p.Rules, p.ClientScoped), noClientBucket: !p.HasClientRule}, nil
	}
	counts := memorystore.New(memorystore.Config{Rules: p.Rules, Capped: c.capped, Layout: c.layout,
		ClientScoped: p.ClientScoped, HasClientRule: p.HasClientRule, Longest: p.Longest, MaxN: p.maxN})
	return &localCounts{plan: p, counts: counts, noClientShare: c.layout != nil && !p.HasClientRule}, nil
}

// localStore is what keeps a local Bucket's counts: the calls
// (memorystore.Counts), or GCRA's buckets (memorystore.TATs).
// Their Decide is called on each concrete type (see allow).
type localStore interface {
	Peek(resource, client string, n int) limits.View
	Flush(resource, client string)
	FlushAll(resource string)
	Sweep()
	Keys() []string
}

// allow decides a call in process. A call heavier than a rule (which
// reaches it only as a fallback's, whose rules are smaller than the
// Bucket's) is denied and recorded nowhere, as the Bucket's look does.
func (l *localCounts) allow(ctx context.Context, resource, client string, n int, how ask, res *Result) error {
	if ctx.Err() != nil {
		*res = Result{}
		return batch.GivenUp(ctx, false, nil)
	}
	call := limits.Call{Client: client, N: n, AtMost: how.atMost}
	if how.atMost {
		call.N = min(n, l.maxN) // a fallback's rules may be smaller than the Bucket's
	}
	evaluate := func(v limits.View) bool {
		weight := l.evaluateCall(res, v, call, l.RecordDenied)
		if how.at != nil {
			*how.at = v.Now
		}
		return (res.Allowed || l.RecordDenied) && weight <= l.maxN
	}
	// Called on the concrete type: through the interface, evaluate would
	// escape, an allocation per decision.
	switch c := l.counts.(type) {
	case *memorystore.Counts:
		c.DecideCall(resource, call, evaluate)
	case *memorystore.TATs:
		c.DecideCall(resource, call, evaluate)
	}
	return nil
}

// read is Peek: in process, a read fails only if ctx has ended.
func (l *localCounts) read(ctx context.Context, resource, client string, n int) (reading, error) {
	if ctx.Err() != nil {
		return reading{}, batch.GivenUp(ctx, false, nil)
	}
	return reading{View: l.counts.Peek(resource, client, n), plan: &l.plan}, nil
}

// flush forgets client's calls at resource: its counts, and its share of
// the resource's.
func (l *localCounts) flush(ctx context.Context, resource, client string) error {
	switch {
	case l.noClientShare:
		return store.ErrNoClientShare
	case l.noClientBucket:
		return store.ErrNoClientBucket
	}
	if ctx.Err() != nil {
		return batch.GivenUp(ctx, false, nil)
	}
	l.counts.Flush(resource, client)
	return nil
}

// flushAll forgets every call at resource.
func (l *localCounts) flushAll(ctx context.Context, resource string) error {
	if ctx.Err() != nil {
		return batch.GivenUp(ctx, false, nil)
	}
	l.counts.FlushAll(resource)
	return nil
}

// finalError leaves err as it is: no breaker watches process memory.
func (*localCounts) finalError(_ context.Context, _ string, err error) error { return err }

// withLimits returns the counts of l judged by p, whose rules differ from
// l's in Requests only: the same counts, kept, read for p's rules from
// now on. ok is false for GCRA's buckets, which a rate and a burst shape.
func (l *localCounts) withLimits(p plan) (c *localCounts, ok bool) {
	counts, ok := l.counts.(*memorystore.Counts)
	if !ok {
		return nil, false
	}
	counts.SetRules(p.Rules, p.maxN)
	return &localCounts{plan: p, counts: counts, noClientShare: l.noClientShare, noClientBucket: l.noClientBucket}, true
}
