package leakybucket

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
// rule is per-resource) and allocates only the Result's slices. The state
// of a key no rule counts any more (idle for the longest window) is freed
// by a later call: memory follows the keys used within the longest window,
// and no goroutine runs in the background.
// The options that concern Redis (WithPrefix, WithLockTTL, WithLockRetry,
// WithScanCount) are accepted and change nothing.
func NewLocal(opts ...Option) (*Bucket, error) {
	cfg, p, err := configure(opts)
	if err != nil {
		return nil, err
	}
	b := newBucket(cfg, p)
	if b.local, err = newLocalCounts(cfg.strategy, p); err != nil {
		return nil, err
	}
	return b, nil
}

// decideLocal is AllowN on a local Bucket.
func (b *Bucket) decideLocal(ctx context.Context, resource, client string, n int) (res Result, err error) {
	if ctx.Err() != nil {
		return Result{}, givenUp(ctx, false, nil)
	}
	b.local.decide(resource, client, n, func(v view) bool {
		res = evaluate(b.plan.rules, v, n, b.cfg.recordDenied)
		return res.Allowed || b.cfg.recordDenied
	})
	return res, nil
}

// localShards is how many locks the keys of a local Bucket are spread
// over: enough that the cores of a large host rarely wait for each other.
const localShards = 256

// localCounts are the counts of a local Bucket: per scope (a resource's,
// for its per-resource rules, and each (resource, client)'s, for the
// per-client ones), the calls of the longest window, oldest first, as the
// Redis strategies hold them.
type localCounts struct {
	plan
	// stamp is when a call made at now leaves the windows, less each
	// window: now, or under Windows the end of now's interval.
	stamp func(now int64) int64
	// capped: SortedSet with WithRecordDenied keeps the newest Requests
	// attempts of each rule (see WithRecordDenied).
	capped bool
	// merged: Windows keeps one count per interval, not a call's
	// client, so a per-resource count loses whose calls it holds.
	merged bool
	start  time.Time
	seed   maphash.Seed
	turns  atomic.Uint64 // decisions made: see sweepNext
	shards [localShards]localShard
}

// localShard is one lock's share of the keys. Its scopes are also in a
// list by their last write, oldest first, so that the idle ones are
// found without a walk of the map.
type localShard struct {
	mu     sync.Mutex
	scopes map[scopeKey]*scope
	oldest *scope
	newest *scope
	counts []count // scratch for a view, under mu
	_      [64]byte
}

// scopeKey names a scope: the resource's (client ""), or a client's; and
// under SortedSet with WithRecordDenied, which caps each rule's count, the
// rule's (its index + 1).
type scopeKey struct {
	resource, client string
	rule             int
}

func newLocalCounts(s Strategy, p plan) (*localCounts, error) {
	l := &localCounts{plan: p, stamp: func(now int64) int64 { return now }, start: time.Now(), seed: maphash.MakeSeed()}
	switch s := s.(type) {
	case windowsStrategy:
		st, err := s.newStore(p)
		if err != nil {
			return nil, err
		}
		l.stamp, l.merged = st.(windowsStore).stamp, true
	case sortedSetStrategy:
		if _, err := s.newStore(p); err != nil {
			return nil, err
		}
		l.capped = p.recordDenied
	}
	for i := range l.shards {
		l.shards[i].scopes = map[scopeKey]*scope{}
		l.shards[i].counts = make([]count, len(p.rules))
	}
	return l, nil
}

// now is the time in ms since the Unix epoch, on the monotonic clock from
// the wall time the Bucket was made at: it never goes back.
func (l *localCounts) now() int64 {
	return (l.start.UnixNano() + time.Since(l.start).Nanoseconds()) / int64(time.Millisecond)
}

// shard returns the shard of a call's scopes: the resource's when a rule
// is per-resource, so that one lock covers the call.
func (l *localCounts) shard(resource, client string) *localShard {
	var h maphash.Hash
	h.SetSeed(l.seed)
	h.WriteString(resource)
	if l.clientScoped {
		h.WriteByte(0)
		h.WriteString(client)
	}
	return &l.shards[h.Sum64()%localShards]
}

// keyOf returns the key of the scope that rule i counts in for client at
// resource, and whether no rule before i counts in it.
func (l *localCounts) keyOf(i int, resource, client string) (scopeKey, bool) {
	key := func(i int) scopeKey {
		k := scopeKey{resource: resource}
		if l.rules[i].Scope == ScopeClient {
			k.client = client
		}
		if l.capped {
			k.rule = i + 1
		}
		return k
	}
	k := key(i)
	for j := range i {
		if key(j) == k {
			return k, false
		}
	}
	return k, true
}

// decide decides a call of weight n by client to resource with judge, and
// records it if judge says so.
func (l *localCounts) decide(resource, client string, n int, judge func(view) bool) {
	now := l.now()
	l.sweepNext(now)
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, l.longest)
	v := sh.view(l, resource, client, now)
	if !judge(v) {
		return
	}
	for i, rule := range l.rules {
		if key, first := l.keyOf(i, resource, client); first {
			sh.record(l, key, rule, client, n, v.stamp, now)
		}
	}
}

// peek returns what a call by client to resource would count now.
func (l *localCounts) peek(resource, client string) view {
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.view(l, resource, client, l.now())
	v.counts = append([]count(nil), v.counts...) // sh.counts is reused under mu
	return v
}

// view is what each rule counts for a call by client now, in sh's scratch
// counts.
func (sh *localShard) view(l *localCounts, resource, client string, now int64) view {
	v := view{now: now, stamp: l.stamp(now), counts: sh.counts}
	for i, rule := range l.rules {
		key, _ := l.keyOf(i, resource, client)
		v.counts[i] = sh.scopes[key].count(rule, now)
	}
	return v
}

// record adds a call of weight n by client, stamped at stamp, to the scope
// of key, made if need be, and moves the scope to the newest end of the
// list.
func (sh *localShard) record(l *localCounts, key scopeKey, rule Rule, client string, n int, stamp, now int64) {
	s := sh.scopes[key]
	if s == nil {
		s = &scope{key: key}
		sh.scopes[key] = s
	} else {
		sh.unlink(s)
	}
	s.written = stamp // the newest call: the scope is idle once it left every window
	sh.link(s)
	e := logEntry{at: stamp, weight: n}
	if !l.merged && key.client == "" {
		e.client = client // a per-resource count keeps whose call it is, for Flush
	}
	if !l.capped {
		s.trim(now, l.longest)
		s.add(e, l.merged)
		return
	}
	// As SortedSet's set of the rule: its window, then its newest
	// Requests.
	s.trim(now, rule.Limit.windowMillis())
	s.add(e, false)
	s.cap(rule.Limit.Requests)
}

// sweepEvery is how many decisions make one sweep of another shard: the
// shards are swept in turn, so that a shard nobody calls any more is
// freed too, within sweepEvery*localShards decisions.
const sweepEvery = 8

// sweepNext sweeps the next shard in turn every sweepEvery calls, unless
// its lock is busy.
func (l *localCounts) sweepNext(now int64) {
	turn := l.turns.Add(1)
	if turn%sweepEvery != 0 {
		return
	}
	sh := &l.shards[turn/sweepEvery%localShards]
	if sh.mu.TryLock() {
		sh.sweep(now, l.longest)
		sh.mu.Unlock()
	}
}

// sweep frees the scopes that no window counts any more at now.
func (sh *localShard) sweep(now, longest int64) {
	for s := sh.oldest; s != nil && s.written+longest <= now; s = sh.oldest {
		sh.unlink(s)
		delete(sh.scopes, s.key)
	}
}

func (sh *localShard) link(s *scope) {
	s.prev, s.next = sh.newest, nil
	if sh.newest != nil {
		sh.newest.next = s
	} else {
		sh.oldest = s
	}
	sh.newest = s
}

func (sh *localShard) unlink(s *scope) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		sh.oldest = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		sh.newest = s.prev
	}
	s.prev, s.next = nil, nil
}

// drop deletes the scope of key.
func (sh *localShard) drop(key scopeKey) {
	if s := sh.scopes[key]; s != nil {
		sh.unlink(s)
		delete(sh.scopes, key)
	}
}

// flush forgets client's calls at resource: its scope, and its share of
// the resource's.
func (l *localCounts) flush(ctx context.Context, resource, client string) error {
	if l.merged && !l.hasClientRule {
		return errNoClientShare
	}
	if ctx.Err() != nil {
		return givenUp(ctx, false, nil)
	}
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	mine := sh.scopes[scopeKey{resource: resource, client: client}] // under Windows, never capped
	for i, rule := range l.rules {
		key, first := l.keyOf(i, resource, client)
		switch {
		case !first:
		case rule.Scope == ScopeClient:
			sh.drop(key)
		case sh.scopes[key] != nil:
			sh.scopes[key].takeShare(client, mine, l.merged)
		}
	}
	return nil
}

// flushAll forgets every call at resource.
func (l *localCounts) flushAll(ctx context.Context, resource string) error {
	if ctx.Err() != nil {
		return givenUp(ctx, false, nil)
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for key := range sh.scopes {
			if key.resource == resource {
				sh.drop(key)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// keys names the scopes held, as "resource" or "resource client": what
// the tests list in place of Redis keys.
func (l *localCounts) keys() []string {
	var out []string
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for key := range sh.scopes {
			out = append(out, strings.TrimSpace(key.resource+" "+key.client))
		}
		sh.mu.Unlock()
	}
	return out
}
