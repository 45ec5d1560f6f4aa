package leakybucket

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/denials"
	"github.com/leakybucket/leakybucket/internal/foresight"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/lock"
	"github.com/leakybucket/leakybucket/internal/store"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// remote is the backend of New: the counts in Redis, kept by a strategy's
// store. A call goes from allow to its line (package batch), whose worker
// (work) decides the waiting calls together in decideBatch.
type remote struct {
	cfg       config
	plan      plan
	strategy  store.Store // the store that cfg.strategy made: its Redis commands
	node      func(ctx context.Context, key string) (*redis.Client, error)
	route     *store.ClusterRoute // nil unless a *redis.ClusterClient
	keyPrefix string              // the prefix and the tag of the strategy's key layout

	clocks    clock.Set
	batches   *batch.Group
	denials   denials.Cache[Result]
	foresight *foresight.Foresight
	breakers  *breaker.Breakers // shared by the Buckets of a Tiers
	holders   lock.Holders
	markers   *txn.Markers
}

func newRemote(cfg config, p plan, st store.Store, node func(context.Context, string) (*redis.Client, error), route *store.ClusterRoute) *remote {
	r := &remote{cfg: cfg, plan: p, strategy: st, node: node, route: route, keyPrefix: cfg.prefix + ":" + st.Tag(),
		batches: batch.NewGroup(), foresight: foresight.New(p.Rules, p.Longest), breakers: cfg.breakers, markers: txn.NewMarkers()}
	if r.breakers == nil {
		r.breakers = &breaker.Breakers{}
	}
	return r
}

// A queued call is what AllowN asks, a call of weight n by client to
// resource, waiting in its line for a batch to decide it.
type queued struct {
	batch.Call
	resource, client string
	n                int
	atMost           bool   // AllowAtMost: as much of n as fits (limits.Call.AtMost)
	res              Result // written by its batch's worker once Answer says the caller waits
	at               int64  // with res: the time its decision read (ask.at)
}

// allow answers from the denial cache when it may, and else queues the
// call in its line.
func (r *remote) allow(ctx context.Context, resource, client string, n int, how ask, res *Result) (err error) {
	if n == 1 && !r.denials.Empty() && r.clockRuns(ctx, resource) {
		if cached, elapsed, ok := r.denials.Answer(resource, client); ok {
			// A caller that loops on its denials would now never wait:
			// let the others of this process run first.
			runtime.Gosched()
			*res = cached.after(elapsed)
			return nil
		}
	}
	start := time.Now()
	if *res, err = r.decide(ctx, resource, client, n, how); err != nil {
		return err
	}
	if valid, ok := cacheable(*res, n, r.cfg.recordDenied); ok {
		r.denials.Keep(resource, client, *res, valid, start)
	}
	return nil
}

// The denial cache (package denials) holds the Results of calls of weight
// 1 that every rule, all of them per-client, denied: until a rule's oldest
// call leaves its window, the same call gets the same Result, its
// durations moved on. WithRecordDenied turns the cache off, as every
// attempt must count; so does a server clock that was not seen moving at
// this host's pace (a test's, which SetTime moves by jumps).

// cacheable reports how long res stays the answer to its call: until the
// shortest RetryAfter of its rules, if every rule is per-client and denied
// a call of weight 1.
func cacheable(res Result, n int, recordDenied bool) (time.Duration, bool) {
	if n != 1 || recordDenied || res.Allowed || len(res.DeniedBy) != len(res.Rules) {
		return 0, false
	}
	shortest := time.Duration(-1)
	for _, rr := range res.Rules {
		if !rr.Rule.PerClient || rr.RetryAfter <= 0 {
			return 0, false
		}
		if shortest < 0 || rr.RetryAfter < shortest {
			shortest = rr.RetryAfter
		}
	}
	return shortest, true
}

// after returns res as it reads elapsed later, with nothing counted or
// gone meanwhile: its durations shortened by elapsed, rounded up to the
// millisecond (Redis's time is in whole milliseconds: never longer than
// Redis would say).
func (res Result) after(elapsed time.Duration) Result {
	elapsed = max(elapsed+time.Millisecond-1, 0).Truncate(time.Millisecond)
	out := res
	out.Rules = make([]RuleResult, len(res.Rules))
	out.DeniedBy = append([]Rule(nil), res.DeniedBy...)
	out.RetryAfter, out.ResetAfter = max(res.RetryAfter-elapsed, 0), max(res.ResetAfter-elapsed, 0)
	for i, rr := range res.Rules {
		rr.RetryAfter, rr.ResetAfter = max(rr.RetryAfter-elapsed, 0), max(rr.ResetAfter-elapsed, 0)
		out.Rules[i] = rr
	}
	return out
}

// decide queues a call in its line, unless the breaker of its server is
// open, and cuts it short should the breaker open while it waits (see
// breaker.go).
func (r *remote) decide(ctx context.Context, resource, client string, n int, how ask) (Result, error) {
	br, cut, err := r.watch(ctx, resource)
	if err != nil {
		return Result{}, err
	}
	call := &queued{Call: batch.Call{Ctx: ctx, Cut: cut}, resource: resource, client: client, n: n, atMost: how.atMost}
	l, first, err := r.batches.Join(r.batchKey(resource, client), call)
	if err != nil {
		return Result{}, err
	}
	if first {
		go r.work(l)
	}
	switch err := r.batches.Wait(l, call); {
	case errors.Is(err, batch.ErrCut):
		return Result{}, br.Refusal()
	case err != nil:
		return Result{}, err
	}
	if how.at != nil {
		*how.at = call.at
	}
	return call.res, nil
}

// work is the worker of line l: it decides l's batches, one at a time,
// until no call waits (package batch). Then no batch is left to carry
// what the last one handed on, which is sent alone.
func (r *remote) work(l *batch.Line) {
	for b := r.batches.Next(l); b != nil; b = r.batches.Next(l) {
		r.batches.Finish(l, b, r.decideBatch(b.Ctx, queuedOf(b.Calls), l))
	}
	l.Carried.Flush()
}

// queuedOf returns the calls of a batch as AllowN queued them.
func queuedOf(calls []batch.Caller) []*queued {
	out := make([]*queued, len(calls))
	for i, c := range calls {
		out[i] = c.(*queued)
	}
	return out
}

// clockRuns reports whether the clock of the server that holds resource
// was seen moving at the pace of this host's: only then may the denial
// cache count time for it (a test's stopped clock moves by jumps).
func (r *remote) clockRuns(ctx context.Context, resource string) bool {
	node, err := r.node(ctx, r.keysOf(resource).Slot())
	return err == nil && r.clocks.Of(node.Options().Addr).Pace() == clock.PaceRunning
}

// batchKey names the line of a call: calls that can be decided in one
// round. Under Logs that is a lock's: the resource's when a rule is
// per-resource, else the (resource, client)'s. The other strategies decide
// a resource's calls in one MULTI/EXEC, or, where every rule is
// per-client, those of the clients that share a line (store.lockFree.Line).
func (r *remote) batchKey(resource, client string) string {
	return r.strategy.Line(r.keysOf(resource), client)
}

// decideBatch decides a batch of calls, all to one resource: the store
// reads the counts and calls evaluate once per call, in arrival order. Under
// SortedSet and Windows, the calls foresight saw no room for only look
// (package foresight); those that then had room are decided again, judged
// again by foresight on what they read, so that only the room's worth of
// them writes (foreseeFound).
// So are the calls sent Far that what was read cannot decide: denied by
// counts read too little for a denial's Result (limits.View.Short), or
// left too little room by a bound of the counts (limits.Count.Bounded).
func (r *remote) decideBatch(ctx context.Context, calls []*queued, l *batch.Line) error {
	resource := calls[0].resource
	where, err := r.siteOf(ctx, resource, &l.Lock)
	var ahead store.Carried
	where.Carry, where.Busy, where.Ahead, where.Acks = &l.Carried, l.Busy, &ahead, r.acks(calls)
	if err != nil {
		return err
	}
	defer ahead.Flush() // what no decision carried, sent alone
	if !r.cfg.noBreaker {
		// A batch that waits this long for Redis makes the breaker look
		// whether the server is gone: see breaker.go.
		defer r.breakers.Of(where.Node).Suspecting()()
	}
	requests := requestsOf(calls)
	if now, ok := where.Clock.Now(); ok && r.foresees() {
		r.foresight.Foresee(resource, requests, now)
	}
	again, err := r.decideRequests(ctx, where, requests, calls)
	if err != nil {
		return err
	}
	r.decideAgain(ctx, where, calls, requests, again)
	return nil
}

// requestsOf returns what the store is asked of each call: its client and
// weight.
func requestsOf(calls []*queued) []limits.Call {
	requests := make([]limits.Call, len(calls))
	for i, c := range calls {
		requests[i] = limits.Call{Client: c.client, N: c.n, AtMost: c.atMost}
	}
	return requests
}

// acks is what a batch's decision asks of the replicas (WithReplicas):
// to acknowledge its writes before the earliest deadline of its calls,
// so that each of them hears why if they do not.
func (r *remote) acks(calls []*queued) txn.Acks {
	if r.cfg.replicas == 0 {
		return txn.Acks{}
	}
	a := txn.Acks{Replicas: r.cfg.replicas, Timeout: r.cfg.replicaWait}
	for _, c := range calls {
		if d, ok := c.Ctx.Deadline(); ok && (a.By.IsZero() || d.Before(a.By)) {
			a.By = d
		}
	}
	return a
}

// redo is a call of a batch to decide again: call i, looking only or not;
// found: it looked, and found room (see foreseeFound).
type redo struct {
	i           int
	look, found bool
}

// decideAgain decides again the calls of a round that again lists: those
// that looked and had room, and those a bound of their counts left
// undecided (Windows), writing, on a full read; those read Short that
// their counts denied (SortedSet), looking, for the full read that their
// denial's Result needs (and if they find room after all, once more,
// writing). Those that looked and found room are judged again by
// foresight first (foreseeFound): some may look again, and so be decided
// again more than once, but each round writes at least one of them. requests is the round's, reused. Only
// the callers of a round that fails get its error.
func (r *remote) decideAgain(ctx context.Context, where store.Site, calls []*queued, requests []limits.Call, again []redo) {
	for len(again) > 0 {
		retry := make([]*queued, len(again))
		for i, a := range again {
			retry[i] = calls[a.i]
			requests[i] = limits.Call{Client: calls[a.i].client, N: calls[a.i].n, Look: a.look, AtMost: calls[a.i].atMost}
		}
		calls, requests = retry, requests[:len(again)]
		r.foreseeFound(where, calls[0].resource, requests, again)
		var err error
		if again, err = r.decideRequests(ctx, where, requests, calls); err != nil {
			for _, c := range calls {
				r.batches.Fail(c, classify(err))
			}
			return
		}
	}
}

// foreseeFound has foresight judge again, by what they read (answer told
// it), the calls that looked and found room (requests[i] stands for
// again[i]): in order, as many as that room holds write, and the others
// look again. Deciding them all again writing would count every call past
// the room, which its rules then deny, until its take-back lands, in the
// counts of every other client of its rules: a hammering client's whole
// batch, when its room comes back (its oldest calls leave the window, or
// another process flushes it) before this process sees it (rule 2).
func (r *remote) foreseeFound(where store.Site, resource string, requests []limits.Call, again []redo) {
	now, ok := where.Clock.Now()
	if !ok || !r.foresees() {
		return
	}
	found := make([]limits.Call, 0, len(again))
	for i, a := range again {
		if a.found {
			found = append(found, requests[i])
		}
	}
	r.foresight.Foresee(resource, found, now)
	for i, a := range again {
		if a.found {
			requests[i], found = found[0], found[1:]
		}
	}
}

// foresees reports whether calls may be sent to look only: not under Logs,
// whose lock lets no other decision count a call before it is judged, nor
// with WithRecordDenied, under which every call counts.
func (r *remote) foresees() bool {
	return !r.strategy.Locked() && !r.cfg.recordDenied
}

// decideRequests has the store decide calls (requests, by call): the
// store records each call that evaluate says to, and once its round is
// over, answer gives the calls their Results and returns those to decide
// again.
func (r *remote) decideRequests(ctx context.Context, where store.Site, requests []limits.Call, calls []*queued) ([]redo, error) {
	verdicts := make([]verdict, len(calls))
	err := r.strategy.Decide(ctx, where, requests, func(i int, v limits.View) bool {
		verdicts[i] = r.evaluate(calls[i], requests[i].Look, v)
		return verdicts[i].record
	})
	return r.answer(calls, verdicts), classify(r.route.Redirected(err))
}

// A verdict is what evaluating one call of a round found.
type verdict struct {
	evaluated bool
	res       Result
	// record: the store records the call. It is admitted (or denied,
	// WithRecordDenied), did not only look, and its caller had not gone.
	record bool
	// again: the call is decided again, on a full read, unrecorded: it
	// looked and had room, or what was read left it undecided
	// (limits.View.Undecided).
	again, undecided bool
	seen             limits.View // what the store read for it, for foresight
	weight           int         // what it was judged at (limits.Call.Weight)
}

// evaluate is the verdict on call c, which only looks if look, given v,
// what every rule counted before it. It only reads: what it finds is
// acted on by answer, once the round is over.
func (r *remote) evaluate(c *queued, look bool, v limits.View) verdict {
	vd := verdict{evaluated: true, seen: foresight.Copy(v)}
	n := r.plan.evaluateCall(&vd.res, v, limits.Call{N: c.n, AtMost: c.atMost}, r.cfg.recordDenied)
	vd.undecided, vd.weight = v.Undecided(r.plan.Rules, n), n
	vd.again = look && vd.res.Allowed || vd.undecided
	vd.record = !vd.again && !look && (vd.res.Allowed || r.cfg.recordDenied) && !c.Gone()
	return vd
}

// answer acts on the verdicts of a round that is over: it gives each
// call decided its Result (a caller gone by now gets none: batch.Group.Answer),
// tells foresight what was read, and returns the calls to decide again:
// looking, if their counts were read Short (SortedSet wrote them, and
// takes them back ahead of the next decision), else writing, on a full
// read.
func (r *remote) answer(calls []*queued, verdicts []verdict) []redo {
	var again []redo
	for i, vd := range verdicts {
		q := calls[i]
		switch {
		case !vd.evaluated:
		case vd.again:
			// What it read is what foresight judges it again by.
			r.foresight.Saw(q.resource, q.client, vd.seen, vd.weight, false)
			again = append(again, redo{i: i, look: vd.seen.Short, found: !vd.undecided})
		default:
			if r.batches.Answer(q) {
				q.res, q.at = vd.res, vd.seen.Now
			}
			r.foresight.Saw(q.resource, q.client, vd.seen, vd.weight, vd.record)
		}
	}
	return again
}

// read reads what every rule counts for a call of weight n by client at
// resource, without writing anything.
func (r *remote) read(ctx context.Context, resource, client string, n int) (reading, error) {
	v, err := guarded(ctx, r, resource, func(ctx context.Context, _ *lock.View) (limits.View, error) {
		where, err := r.siteOf(ctx, resource, nil)
		if err != nil {
			return limits.View{}, err
		}
		v, err := r.strategy.Peek(ctx, where, client, n)
		return v, classify(r.route.Redirected(err))
	})
	return reading{View: v, plan: &r.plan}, err
}

// flush is Flush on Redis: the cached denials are forgotten before and
// after, for a decision that raced it.
func (r *remote) flush(ctx context.Context, resource, client string) error {
	r.denials.Forget(resource, &client)
	_, err := guarded(ctx, r, resource, func(ctx context.Context, view *lock.View) (struct{}, error) {
		where, err := r.siteOf(ctx, resource, view)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, classify(r.route.Redirected(r.strategy.Flush(ctx, where, client)))
	})
	r.denials.Forget(resource, &client)
	r.foresight.Drop(resource, &client)
	return err
}

// flushAll is FlushAll on Redis.
func (r *remote) flushAll(ctx context.Context, resource string) error {
	r.denials.Forget(resource, nil)
	_, err := guarded(ctx, r, resource, func(ctx context.Context, view *lock.View) (struct{}, error) {
		where, err := r.siteOf(ctx, resource, view)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, classify(r.route.Redirected(r.strategy.FlushAll(ctx, where)))
	})
	r.denials.Forget(resource, nil)
	r.foresight.Drop(resource, nil)
	return err
}

// nodeOf returns how to find the client of the node that owns a key.
func nodeOf(rdb redis.UniversalClient) (func(context.Context, string) (*redis.Client, error), error) {
	switch c := rdb.(type) {
	case *redis.Client:
		if c != nil {
			return func(context.Context, string) (*redis.Client, error) { return c, nil }, nil
		}
	case *redis.ClusterClient:
		if c != nil {
			return c.MasterForKey, nil
		}
	case *redis.Ring:
		if c != nil {
			return func(_ context.Context, key string) (*redis.Client, error) { return c.GetShardClientForKey(key) }, nil
		}
	}
	return nil, ErrUnsupportedClient
}

// siteOf returns where resource's counts live.
func (r *remote) siteOf(ctx context.Context, resource string, view *lock.View) (store.Site, error) {
	ks := r.keysOf(resource)
	node, err := r.node(ctx, ks.Slot())
	if err != nil {
		return store.Site{}, classify(err)
	}
	if err := r.admit(node); err != nil {
		return store.Site{}, err // the breaker is open: see breaker.go
	}
	refind := func(ctx context.Context) (*redis.Client, error) { return r.node(ctx, ks.Slot()) }
	return store.Site{Node: node, Keys: ks, Clock: r.clocks.Of(node.Options().Addr), Route: r.route, Lock: view, Holders: &r.holders, Markers: r.markers, Refind: refind}, nil
}

// keysOf names the keys of resource.
func (r *remote) keysOf(resource string) keys.Space {
	return keys.Of(r.keyPrefix, resource)
}
