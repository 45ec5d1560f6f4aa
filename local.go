package leakybucket

import (
	"context"
	"hash/maphash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/limits"
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
// by a later call, and the room of a shard's map or a key's calls that
// once held four times what they hold now is given back: memory follows
// the keys used within the longest window, also after a churn of
// millions, and no goroutine runs in the background.
// The options that concern Redis (WithPrefix, WithLockTTL, WithLockWait,
// WithScanCount) are accepted and change nothing.
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

// allow decides a call in process.
func (l *localCounts) allow(ctx context.Context, resource, client string, n int, res *Result) error {
	if ctx.Err() != nil {
		*res = Result{}
		return batch.GivenUp(ctx, false, nil)
	}
	l.decide(resource, client, n, func(v limits.View) bool {
		l.evaluateInto(res, v, n, l.RecordDenied)
		return res.Allowed || l.RecordDenied
	})
	return nil
}

// read is peek: in process, a read cannot fail (the Bucket's bound saw
// ctx).
func (l *localCounts) read(_ context.Context, resource, client string, _ int) (limits.View, error) {
	return l.peek(resource, client), nil
}

// settle leaves err as it is: no breaker watches process memory.
func (*localCounts) settle(_ context.Context, _ string, err error) error { return err }

// localShards is how many locks the keys of a local Bucket are spread
// over: enough that the cores of a large host rarely wait for each other.
const localShards = 256

// localCounts are the counts of a local Bucket: per scope (a resource's,
// for its per-resource rules, and each (resource, client)'s, for the
// per-client ones), the calls of the longest window, oldest first, as the
// Redis strategies hold them.
type localCounts struct {
	plan
	// capped: SortedSet with WithRecordDenied keeps the newest Requests
	// attempts of each rule (see WithRecordDenied).
	capped bool
	// merged: Windows keeps one count per interval of each lane of its
	// rules (package intervals), not a call's client, so a per-resource count
	// loses whose calls it holds.
	merged bool
	layout intervals.Layout
	// reach is how far past a call's time its stamps can be (Windows
	// stamps a call at the end of its interval): a scope's written is the
	// call's time plus reach, at least every stamp it holds, and grows in
	// the order of the calls.
	reach int64
	// counts are the counts a call is recorded in, and reads the one each
	// rule reads.
	counts []countSpec
	reads  []int
	maxN   int // the smallest Requests of the rules: no call weighs more
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
	peak   int // the most scopes held since the map was made: see shrink
	oldest *scope
	newest *scope
	counts []limits.Count // scratch for a view, under mu
	_      [64]byte
}

// scopeKey names a scope: the resource's (client ""), or a client's; and
// part says which of its counts: under SortedSet with WithRecordDenied,
// which caps each rule's count, the rule's (its index + 1); under Windows,
// a lane's (its index).
type scopeKey struct {
	resource, client string
	part             int
}

// countSpec is one count a call is recorded in: per resource or per
// client, which part, and the rule whose window and Requests cap it (see
// capped).
type countSpec struct {
	perClient bool
	part      int
	rule      int
}

// key is the key of the count c of client at resource.
func (c countSpec) key(resource, client string) scopeKey {
	if !c.perClient {
		client = ""
	}
	return scopeKey{resource: resource, client: client, part: c.part}
}

// listCounts lists the counts a call is recorded in, and the one each rule
// reads: as the Redis strategies keep them. Under Windows a client's
// counts hold every lane, as its hash holds every span, so that Flush can
// take its share out of the resource's.
func (l *localCounts) listCounts() {
	add := func(c countSpec) int {
		if i := slices.IndexFunc(l.counts, func(have countSpec) bool { return have.perClient == c.perClient && have.part == c.part }); i >= 0 {
			return i
		}
		l.counts = append(l.counts, c)
		return len(l.counts) - 1
	}
	for i, rule := range l.Rules {
		c := countSpec{perClient: rule.PerClient, rule: i}
		switch {
		case l.capped:
			c.part = i + 1
		case l.merged:
			c.part = l.layout.OfRule[i]
		}
		l.reads = append(l.reads, add(c))
		if l.merged && l.HasClientRule {
			add(countSpec{perClient: true, part: c.part, rule: i})
		}
	}
}
func newLocalCounts(s Strategy, p plan) (*localCounts, error) {
	l := &localCounts{plan: p, maxN: p.Rules[0].Requests, start: time.Now(), seed: maphash.MakeSeed()}
	for _, r := range p.Rules {
		l.maxN = min(l.maxN, r.Requests)
	}
	st, err := s.newStore(p) // checks the rules as New does
	if err != nil {
		return nil, err
	}
	c := st.Counting()
	l.capped = c.Capped
	if c.Layout != nil {
		l.layout, l.merged = *c.Layout, true
		for _, lane := range l.layout.Lanes {
			if !lane.Fixed {
				l.reach = max(l.reach, lane.Span-1)
			}
		}
	}
	l.listCounts()
	for i := range l.shards {
		l.shards[i].scopes = map[scopeKey]*scope{}
		l.shards[i].counts = make([]limits.Count, len(p.Rules))
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
	if l.ClientScoped {
		h.WriteByte(0)
		h.WriteString(client)
	}
	return &l.shards[h.Sum64()%localShards]
}

// decide decides a call of weight n by client to resource with judge, and
// records it if judge says so.
func (l *localCounts) decide(resource, client string, n int, judge func(limits.View) bool) {
	now := l.now()
	l.sweepNext(now)
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, l.Longest)
	v := sh.view(l, resource, client, now)
	if !judge(v) {
		return
	}
	for _, c := range l.counts {
		sh.record(l, c, resource, client, n, now)
	}
}

// peek returns what a call by client to resource would count now. The
// caller evaluates the view after the lock is let go, while other calls
// append to, merge, cap and rewrite the scopes' entries: so the view holds
// copies, of the counts (sh.counts is reused under mu) and of as many of
// each count's oldest calls as evaluate can read (see readable).
func (l *localCounts) peek(resource, client string) limits.View {
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.view(l, resource, client, l.now())
	v.Counts = slices.Clone(v.Counts)
	for i := range v.Counts {
		c := &v.Counts[i]
		c.Oldest = slices.Clone(c.Oldest[:l.readable(l.Rules[i], *c)])
	}
	return v
}

// readable is how many of c's oldest calls UntilRoom can read for a call of
// weight up to maxN (the most check lets through), counted too if it is
// denied and recorded: those whose weight brings c's count, with the
// call's, down to room for it. Not the whole window, which may hold a
// million calls of a rule with room to spare. Every call of c.Oldest
// counts (count and CountOf search past the others).
func (l *localCounts) readable(rule limits.Rule, c limits.Count) int {
	over := limits.AddCapped(limits.AddCapped(c.Used, l.maxN), l.maxN) - rule.Requests
	i := 0
	for left := 0; i < len(c.Oldest) && left < over; i++ {
		left = limits.AddCapped(left, c.Oldest[i].Weight)
	}
	return i
}

// view is what each rule counts for a call by client now, in sh's scratch
// counts.
func (sh *localShard) view(l *localCounts, resource, client string, now int64) limits.View {
	v := limits.View{Now: now, Counts: sh.counts}
	for i, rule := range l.Rules {
		c := l.counts[l.reads[i]]
		v.Counts[i] = sh.scopes[c.key(resource, client)].count(rule, now, l.Longest)
		v.Counts[i].Stamp = l.stamp(c, now)
	}
	return v
}

// stamp is when a call made at now starts to leave the windows of count
// c, less each window: now, or under Windows its interval's stamp in c's
// lane.
func (l *localCounts) stamp(c countSpec, now int64) int64 {
	if l.merged {
		return l.layout.Lanes[c.part].Stamp(now)
	}
	return now
}

// record adds a call of weight n by client at now to count c, made if need
// be, and moves its scope to the newest end of the list.
func (sh *localShard) record(l *localCounts, c countSpec, resource, client string, n int, now int64) {
	key := c.key(resource, client)
	s := sh.scopes[key]
	if s == nil {
		s = &scope{key: key}
		sh.scopes[key] = s
		sh.peak = max(sh.peak, len(sh.scopes))
	} else {
		sh.unlink(s)
	}
	s.written = now + l.reach // the scope is idle once its newest call left every window
	sh.link(s)
	e := limits.Entry{At: l.stamp(c, now), Weight: n}
	if !l.merged && key.client == "" {
		e.Client = client // a per-resource count keeps whose call it is, for Flush
	}
	if !l.capped {
		s.trim(now, l.Longest)
		s.add(e, l.merged)
		return
	}
	// As SortedSet's set of the rule: its window, then its newest
	// Requests.
	rule := l.Rules[c.rule]
	s.trim(now, rule.Window)
	s.add(e, false)
	s.cap(rule.Requests)
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
		sh.sweep(now, l.Longest)
		sh.mu.Unlock()
	}
}

// sweep frees the scopes that no window counts any more at now.
func (sh *localShard) sweep(now, longest int64) {
	for s := sh.oldest; s != nil && s.written+longest <= now; s = sh.oldest {
		sh.unlink(s)
		delete(sh.scopes, s.key)
	}
	sh.shrink()
}

// mapFloor is the peak under which a shard's map is kept however few
// scopes it holds: a few kB a shard, not worth a copy.
const mapFloor = 64

// shrink moves the scopes into a new map when they are under a quarter of
// the most the map held. A Go map never gives back the room of its peak:
// without this, a million clients seen once would hold tens of MB as long
// as the Bucket lives, while the README promises that memory follows the
// keys used within the longest window. The copy moves under a quarter of
// the peak, after over three quarters of it were deleted: O(1) a scope.
func (sh *localShard) shrink() {
	if sh.peak <= mapFloor || len(sh.scopes)*4 >= sh.peak {
		return
	}
	scopes := make(map[scopeKey]*scope, len(sh.scopes))
	for key, s := range sh.scopes {
		scopes[key] = s
	}
	sh.scopes, sh.peak = scopes, len(scopes)
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
	if l.merged && !l.HasClientRule {
		return store.ErrNoClientShare
	}
	if ctx.Err() != nil {
		return batch.GivenUp(ctx, false, nil)
	}
	sh := l.shard(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, c := range l.counts {
		if s := sh.scopes[c.key(resource, client)]; s != nil && !c.perClient {
			// Under Windows, the client's count of the same lane.
			mine := sh.scopes[countSpec{perClient: true, part: c.part}.key(resource, client)]
			s.takeShare(client, mine, l.merged)
		}
	}
	for _, c := range l.counts {
		if c.perClient {
			sh.drop(c.key(resource, client))
		}
	}
	return nil
}

// flushAll forgets every call at resource.
func (l *localCounts) flushAll(ctx context.Context, resource string) error {
	if ctx.Err() != nil {
		return batch.GivenUp(ctx, false, nil)
	}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		for key := range sh.scopes {
			if key.resource == resource {
				sh.drop(key)
			}
		}
		sh.shrink()
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
