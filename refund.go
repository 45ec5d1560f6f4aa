package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/memorystore"
	"github.com/leakybucket/leakybucket/internal/store"
)

// Giving weight back (docs/api.md, "Refunds"): Admit is AllowN that also
// returns, for an admitted call, an Admission, a handle on what the
// decision counted; Refund gives some or all of it back, once. The handle
// names the call, not the client: so a refund can only take out weight
// this call put in, and only while it is still counted.

// ErrInvalidAdmission: Refund was given a nil Admission, the zero
// Admission, or one another Bucket returned. Nothing was written.
var ErrInvalidAdmission = errors.New("leakybucket: invalid admission")

// errNoRefunds: Admit on a Bucket whose strategy cannot give weight back.
var errNoRefunds = fmt.Errorf("leakybucket: %w: refunds need the GCRA strategy", errors.ErrUnsupported)

// An Admission is the weight Admit admitted for one call, as Refund can
// give it back. It belongs to the Bucket and the process that made it:
// it cannot be sent to another process, nor given to another Bucket. It
// is safe for concurrent use; concurrent Refunds of it run one at a time.
type Admission struct {
	bucket           *Bucket
	resource, client string
	at               int64  // ms: the time its decision read (ask.at)
	gen              string // the resource's generation read before it was decided: see Refund
	fallback         bool   // decided by the fallback (Result.Fallback)

	admitted int

	mu    sync.Mutex // held through a Refund, so that two never both give it back
	held  int        // the weight not given back yet
	given []int64    // by rule: the cost given back (limits.Bucket.Giveback)
}

// Held is the weight of the Admission not given back yet (or, after a
// Refund's error, 0: see Refund). Some of it may have left the rules by
// now: Refund says what it could give back.
func (a *Admission) Held() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held
}

// Admit is AllowN(ctx, resource, client, n) that also returns, when the
// call is admitted, its Admission, whose weight Refund can give back (a
// request rejected downstream, a job cancelled); nil when it is denied
// or fails. Its Result, errors and observer are AllowN's.
//
// Only a Bucket of the GCRA strategy (New or NewLocal) can give weight
// back so far: under any other, Admit returns an error matching
// errors.ErrUnsupported and sends nothing.
func (b *Bucket) Admit(ctx context.Context, resource, client string, n int) (a *Admission, res Result, err error) {
	defer b.observe(ctx, b.observed(), opAllow, resource, client, n, &res, &err)
	if _, ok := b.cfg.strategy.(gcraStrategy); !ok {
		return nil, Result{}, errNoRefunds
	}
	if err = b.check(resource, client, n); err != nil {
		return nil, Result{}, err
	}
	if n > b.plan.maxN {
		err = b.look(ctx, resource, client, n, &res) // a denial: see AllowNInto
		return nil, res, err
	}
	// The generation, read before the decision: a Flush after it, or
	// between it and the decision, changes it, and Refund then gives back
	// nothing, never weight the Flush already took out.
	gen, err := b.counts.generation(ctx, resource)
	if err != nil {
		return nil, Result{}, b.counts.finalError(ctx, resource, err)
	}
	var at int64
	if err = b.counts.allow(ctx, resource, client, n, ask{at: &at}, &res); err != nil || !res.Allowed {
		return nil, res, err
	}
	return &Admission{bucket: b, resource: resource, client: client, at: at, gen: gen, fallback: res.Fallback,
		admitted: n, held: n, given: make([]int64, len(res.Rules))}, res, nil
}

// Refund gives back up to n of a's weight, and returns how much it gave
// back: at most what a holds, and under each rule no more than the call
// may still hold there. Under GCRA, each rule's TAT moves back by the
// cost of what is given back, never before now: the part of the call that
// drained since it was decided (counted from when its decision read the
// bucket, no later than the call started to count) is not given back,
// since it no longer takes anyone's room; a call that waited behind older
// weight in a full bucket thus gets back a little less than it still
// holds. So a refund never lets a rule admit more than it would had the
// call weighed less by what was given back. What it returns is rounded
// up to whole units of weight (Refund(ctx, a, 1) 30 ms after a call of
// weight 1 under Per(10, time.Second) gives back 0.7 of a unit, and
// returns 1), and that much leaves a. A second Refund of the same weight,
// or one after the call drained, gives back nothing: it returns 0 and no
// error.
//
// A call the fallback decided (Result.Fallback) is given back in process,
// where it was counted. A Flush or FlushAll of the resource after Admit
// began (in process: of any resource) already took the call's weight
// out: a Refund then gives back nothing, and returns 0 and no error; so
// weight is never given back twice, and the calls counted since keep
// their room.
//
// Errors, to match with errors.Is: ErrInvalidAdmission (a nil or zero
// Admission, or another Bucket's) or ErrInvalidWeight (n below 1), for
// which nothing is sent; ctx's error if it had already ended (nothing is
// sent, the Admission is kept); else the errors of AllowN. After an
// error once a refund was sent, whether it applied is unknown: the
// Admission then holds nothing, and gives nothing more back (a refund
// applied twice would give room it never took).
func (b *Bucket) Refund(ctx context.Context, a *Admission, n int) (int, error) {
	switch {
	case a == nil || a.bucket == nil:
		return 0, fmt.Errorf("%w: nil or zero", ErrInvalidAdmission)
	case a.bucket != b:
		return 0, fmt.Errorf("%w: admitted by another Bucket", ErrInvalidAdmission)
	case n < 1:
		return 0, fmt.Errorf("%w: n = %d, want at least 1", ErrInvalidWeight, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.held == 0 {
		return 0, nil
	}
	if ctx.Err() != nil {
		return 0, batch.GivenUp(ctx, false, nil)
	}
	back, err := b.counts.refund(ctx, a, min(n, a.held))
	if err != nil {
		a.held = 0
		return 0, b.counts.finalError(ctx, a.resource, err)
	}
	a.held -= min(back, a.held)
	return back, nil
}

// refund gives back up to n of a's weight on Redis: the store's
// compare-and-swap (store.Refunder).
func (r *remote) refund(ctx context.Context, a *Admission, n int) (int, error) {
	st, ok := r.strategy.(store.Refunder)
	if !ok {
		return 0, errNoRefunds
	}
	where, err := r.siteOf(ctx, a.resource, nil)
	if err != nil {
		return 0, err
	}
	cost, back, err := st.Refund(ctx, where, a.client, a.at, a.admitted, n, a.given, a.gen)
	addTo(a.given, cost)
	if back > 0 {
		// A denial cached before the refund would now deny too long.
		r.denials.Forget(a.resource, &a.client)
	}
	return back, classify(r.route.Redirected(err))
}

// refund gives back up to n of a's weight in process.
func (l *localCounts) refund(_ context.Context, a *Admission, n int) (int, error) {
	t, ok := l.counts.(*memorystore.TATs)
	if !ok {
		return 0, errNoRefunds
	}
	cost, back := t.Refund(a.resource, a.client, a.at, a.admitted, n, a.given, a.gen)
	addTo(a.given, cost)
	return back, nil
}

// addTo adds cost to given, rule by rule (none if cost is nil).
func addTo(given, cost []int64) {
	for r, c := range cost {
		given[r] += c
	}
}

// generation reads the resource's generation on Redis (store.Refunder).
func (r *remote) generation(ctx context.Context, resource string) (string, error) {
	st, ok := r.strategy.(store.Refunder)
	if !ok {
		return "", errNoRefunds
	}
	where, err := r.siteOf(ctx, resource, nil)
	if err != nil {
		return "", err
	}
	gen, err := st.Generation(ctx, where)
	return gen, classify(r.route.Redirected(err))
}

// generation is the in-process store's generation.
func (l *localCounts) generation(context.Context, string) (string, error) {
	t, ok := l.counts.(*memorystore.TATs)
	if !ok {
		return "", errNoRefunds
	}
	return t.Generation(), nil
}
