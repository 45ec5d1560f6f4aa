package leakybucket

import (
	"context"
	"runtime"
	"time"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/lock"
)

// The decision path, top to bottom: AllowN validates its input and queues
// the call in its line (batch.go); a worker takes the waiting calls as one
// batch and decideBatch asks the store to decide them, in one MULTI/EXEC
// (SortedSet, Windows) or under the lock (Logs); the store reads what each
// rule counts before each call and asks judge, which evaluates the rules
// (result.go) and answers the caller; the store then records the admitted
// calls (or keeps them, and takes the denied ones back). Each strategy's
// Redis commands live in its own file: logs.go, sortedset.go, windows.go.

// Allow is shorthand for AllowN(ctx, resource, client, 1).
func (b *Bucket) Allow(ctx context.Context, resource, client string) (Result, error) {
	return b.AllowN(ctx, resource, client, 1)
}

// AllowN admits a request of weight n by client to resource if every rule
// has room for n more, and then records it under every rule; a denied
// request is recorded nowhere (unless WithRecordDenied). A denial is a
// Result with Allowed false, not an error. The client may be empty only if
// every rule is per-resource.
//
// Concurrent calls of one Bucket to the same resource are batched: a worker
// decides them all in arrival order, each with its own Result, in one
// round. A call of weight 1 that every rule, all per-client, denied is
// answered in-process until a rule has room again, for at most 900 ms.
// AllowN returns by ctx's deadline whatever Redis does; what it left under
// way (the batch, the release of a lock) finishes in the background.
//
// Errors, to match with errors.Is: ErrEmptyResource, ErrEmptyClient or
// ErrInvalidWeight for bad input (nothing is sent to Redis);
// ErrLockNotObtained (Logs) if another holder held the lock until ctx ended
// or the retry strategy gave up; ErrUnavailable, with its cause, if Redis
// could not be reached; ErrLockExpired (Logs) if the lock expired before
// the decision was written; ctx's error if it ended while Redis was slow to
// answer; or a Redis error, wrapped. With any error nothing was recorded,
// except that a call whose write was under way when the error came may
// have been counted (never admitted uncounted).
func (b *Bucket) AllowN(ctx context.Context, resource, client string, n int) (res Result, err error) {
	if b.local != nil {
		err = b.AllowNInto(ctx, resource, client, n, &res)
		return res, err
	}
	defer b.observe(ctx, b.observed(), OpAllow, resource, client, n, &res, &err)
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	if !b.denials.empty() && b.clockRuns(ctx, resource) {
		if res, ok := b.denials.answer(resource, client, n); ok {
			// A caller that loops on its denials would now never wait:
			// let the others of this process run first.
			runtime.Gosched()
			return res, nil // see denials.go
		}
	}
	start := time.Now()
	res, err = b.batches.do(b.batchKey(resource, client), &call{ctx: ctx, resource: resource, client: client, n: n})
	if err == nil {
		b.denials.keep(resource, client, n, b.cfg.recordDenied, res, start)
	}
	return res, err
}

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
	if b.local == nil {
		*res, err = b.AllowN(ctx, resource, client, n)
		return err
	}
	defer b.observe(ctx, b.observed(), OpAllow, resource, client, n, res, &err)
	if err = b.check(resource, client, n); err != nil {
		*res = Result{}
		return err
	}
	return b.decideLocal(ctx, resource, client, n, res) // local.go
}

// clockRuns reports whether the clock of the server that holds resource
// was seen moving at the pace of this host's: only then may the denial
// cache count time for it (a test's stopped clock moves by jumps).
func (b *Bucket) clockRuns(ctx context.Context, resource string) bool {
	node, err := b.node(ctx, b.keysOf(resource).Slot())
	return err == nil && b.clocks.Of(node.Options().Addr).Pace() == clock.PaceRunning
}

// batchKey names the line of a call: calls that can be decided in one
// round. Under Logs that is a lock's: the resource's when a rule is
// per-resource, else the (resource, client)'s. The other strategies decide
// a whole resource's calls in one MULTI/EXEC.
func (b *Bucket) batchKey(resource, client string) string {
	ks := b.keysOf(resource)
	if _, locked := b.store.(logsStore); locked {
		return lockKey(ks, b.plan, client)
	}
	return ks.Slot()
}

// decideBatch decides the calls of batch, all to one resource: the store
// reads the counts and calls judge once per call, in arrival order. Under
// SortedSet and Windows, the calls foresight saw no room for only look
// (foresight.go); those that then had room are decided again, writing.
func (b *Bucket) decideBatch(ctx context.Context, batch []*call, sh *shared) error {
	at, err := b.siteOf(ctx, batch[0].resource, &sh.lock)
	at.carry, at.busy = &sh.carry, sh.busy
	if err != nil {
		return err
	}
	requests := make([]request, len(batch))
	for i, c := range batch {
		requests[i] = request{client: c.client, n: c.n}
	}
	if now, ok := at.clock.Now(); ok && b.foresees() {
		b.foresight.foresee(b.plan, batch[0].resource, requests, now)
	}
	again, err := b.decideRequests(ctx, at, batch, requests)
	if err != nil || len(again) == 0 {
		return err
	}
	// Calls that only looked, and had room: decided again, writing. Only
	// their callers get this round's error.
	retry := make([]*call, len(again))
	for i, j := range again {
		retry[i] = batch[j]
		requests[i] = request{client: batch[j].client, n: batch[j].n}
	}
	if _, err := b.decideRequests(ctx, at, retry, requests[:len(again)]); err != nil {
		b.batches.fail(retry, classify(err))
	}
	return nil
}

// foresees reports whether calls may be sent to look only: not under Logs,
// whose lock lets no other decision count a call before it is judged, nor
// with WithRecordDenied, under which every call counts.
func (b *Bucket) foresees() bool {
	_, locked := b.store.(logsStore)
	return !locked && !b.cfg.recordDenied
}

// decideRequests has the store decide calls (requests, by call), and
// returns the calls that only looked and had room, to decide again.
func (b *Bucket) decideRequests(ctx context.Context, at site, calls []*call, requests []request) ([]int, error) {
	var again []int
	err := b.store.decide(ctx, at, requests, func(i int, v view) bool {
		c := calls[i]
		res := evaluate(b.plan.rules, v, c.n, b.cfg.recordDenied)
		if requests[i].look && res.Allowed {
			again = append(again, i)
			return false
		}
		recorded := b.batches.settle(c, res) && (res.Allowed || b.cfg.recordDenied)
		b.foresight.saw(b.plan, c.resource, c.client, v, c.n, recorded && !requests[i].look)
		return recorded && !requests[i].look
	})
	return again, classify(b.route.redirected(err))
}

// Peek is shorthand for PeekN(ctx, resource, client, 1).
func (b *Bucket) Peek(ctx context.Context, resource, client string) (Result, error) {
	return b.PeekN(ctx, resource, client, 1)
}

// PeekN returns what AllowN would answer now, recording nothing: Remaining
// is what would be left after the call. It takes no lock, so a decision
// under way elsewhere may be missed. It costs one round trip (Logs: when
// the SCAN fits in one page).
func (b *Bucket) PeekN(ctx context.Context, resource, client string, n int) (res Result, err error) {
	defer b.observe(ctx, b.observed(), OpPeek, resource, client, n, &res, &err)
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	return bounded(ctx, func(ctx context.Context, _ *lock.View) (Result, error) {
		v, err := b.read(ctx, resource, client, n)
		if err != nil {
			return Result{}, err
		}
		return evaluate(b.plan.rules, v, n, b.cfg.recordDenied), nil
	})
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
	return bounded(ctx, func(ctx context.Context, _ *lock.View) ([]RuleResult, error) {
		v, err := b.read(ctx, resource, client, 1)
		if err != nil {
			return nil, err
		}
		now, one := evaluate(b.plan.rules, v, 0, false), evaluate(b.plan.rules, v, 1, false)
		for i := range now.Rules {
			now.Rules[i].RetryAfter = one.Rules[i].RetryAfter
		}
		return now.Rules, nil
	})
}

// read reads what every rule counts for a call of weight n by client at
// resource, without writing anything.
func (b *Bucket) read(ctx context.Context, resource, client string, n int) (view, error) {
	if b.local != nil {
		return b.local.peek(resource, client), nil // bounded saw ctx
	}
	at, err := b.siteOf(ctx, resource, nil)
	if err != nil {
		return view{}, err
	}
	v, err := b.store.peek(ctx, at, client, n)
	return v, classify(b.route.redirected(err))
}
