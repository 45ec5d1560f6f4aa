// Package memorystore keeps the counts of a Bucket made by NewLocal in this
// process's memory: per scope (a resource's, for its per-resource rules,
// and each (resource, client)'s, for the per-client ones), the calls of
// the longest window, oldest first, as the Redis strategies hold them. It
// records calls, reads what each rule counts and forgets calls; judging a
// call by its counts, and the errors a Bucket returns, are the caller's.
//
// The scopes are spread over shards, one lock each. A scope no rule
// counts any more is freed by a later call, within two windows of its
// newest call (see shard.sweep), and the room of a shard's map or of a
// scope's calls is given back once they hold a quarter of it: no
// goroutine runs in the background.
package memorystore

import (
	"hash/maphash"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// Config is what Counts need to know of a Bucket's rules and strategy.
type Config struct {
	Rules []limits.Rule // in the Bucket's order, which a View's counts follow
	// Capped: SortedSet with WithRecordDenied keeps the newest Requests
	// attempts of each rule, so each rule has a count of its own, capped
	// at them.
	Capped bool
	// Layout is the lanes of Windows' rules (package intervals), nil under
	// the other strategies: Windows keeps one count per interval of each
	// lane, not a call's client, so a per-resource count loses whose calls
	// it holds.
	Layout *intervals.Layout
	// ClientScoped: every rule is per-client, so a call's counts are all
	// its client's, and its client picks its shard too.
	ClientScoped  bool
	HasClientRule bool
	Longest       int64 // the longest window of the rules, ms: how long a call is counted
	MaxN          int   // the smallest Requests of the rules: no call weighs more
}

// shardCount is how many locks the scopes are spread over: enough that
// the cores of a large host rarely wait for each other.
const shardCount = 256

// Counts are the counts of one Bucket, by scope. Every method may be
// called from any goroutine against any other.
type Counts struct {
	rules        []limits.Rule
	clientScoped bool
	longest      int64
	capped       bool
	// merged: counted per interval of layout's lanes (Config.Layout).
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
	maxN   int
	start  time.Time
	seed   maphash.Seed
	// noClient is the hash of the client "", whose scopes are per
	// resource.
	noClient uint64
	turns    atomic.Uint64 // decisions made: see sweepNext
	shards   [shardCount]shard
}

// shard is one lock's share of the scopes. Its scopes are also in a list,
// by when they were listed (scope.listed), oldest first, so that the idle
// ones are found without a walk of the map.
type shard struct {
	mu     sync.Mutex
	scopes scopeMap
	peak   int // the most scopes held since the map was made: see shrink
	oldest *scope
	newest *scope
	counts []limits.Count // scratch for a view, under mu
	// found are the scopes of the call's counts, by l.counts, as the view
	// found them (nil: none yet): the call is recorded in them without a
	// second lookup; and from, by rule, where in its scope's live calls
	// each rule's count starts. Scratch, under mu.
	found []*scope
	from  []int
	// read is the room of the counts' Oldest, made for a denial (see
	// readOldest). Scratch, under mu.
	read []limits.Entry
	_    [64]byte
}

// scopeKey names a scope: the resource's (client ""), or a client's; and
// part says which of its counts: when capped, which caps each rule's
// count, the rule's (its index + 1); under a layout, a lane's (its index).
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

// who is a call's resource and client, and the hash of each, made once a
// call: its shard and the hashes of its scopes' keys are made of them.
type who struct {
	resource, client         string
	resourceHash, clientHash uint64
}

// who hashes resource and client.
func (l *Counts) who(resource, client string) who {
	return who{resource: resource, client: client,
		resourceHash: maphash.String(l.seed, resource), clientHash: maphash.String(l.seed, client)}
}

// keyOf returns the key of w's count c, and its hash.
func (l *Counts) keyOf(c countSpec, w who) (scopeKey, uint64) {
	clientHash := w.clientHash
	if !c.perClient {
		clientHash = l.noClient
	}
	return c.key(w.resource, w.client), mix(w.resourceHash, clientHash, c.part)
}

// mix is the hash of a key, or with part 0 of a shard, of the hashes of a
// resource and a client.
func mix(resourceHash, clientHash uint64, part int) uint64 {
	return resourceHash ^ bits.RotateLeft64(clientHash, 31)*0x9e3779b97f4a7c15 ^ uint64(part)
}

// New returns empty counts of cfg's rules. The caller has checked the
// rules: there is at least one.
func New(cfg Config) *Counts {
	l := &Counts{rules: cfg.Rules, clientScoped: cfg.ClientScoped, longest: cfg.Longest, capped: cfg.Capped,
		maxN: cfg.MaxN, start: time.Now(), seed: maphash.MakeSeed()}
	if cfg.Layout != nil {
		l.layout, l.merged = *cfg.Layout, true
		for _, lane := range l.layout.Lanes {
			if !lane.Fixed {
				l.reach = max(l.reach, lane.Span-1)
			}
		}
	}
	l.noClient = maphash.String(l.seed, "")
	l.listCounts(cfg.HasClientRule)
	for i := range l.shards {
		l.shards[i].scopes = scopeMap{}
		l.shards[i].counts = make([]limits.Count, len(cfg.Rules))
		l.shards[i].found = make([]*scope, len(l.counts))
		l.shards[i].from = make([]int, len(cfg.Rules))
	}
	return l
}

// listCounts lists the counts a call is recorded in, and the one each rule
// reads: as the Redis strategies keep them. Under a layout, with a
// per-client rule, a client's counts hold every lane, as its hash holds
// every span, so that Flush can take its share out of the resource's.
func (l *Counts) listCounts(hasClientRule bool) {
	add := func(c countSpec) int {
		if i := slices.IndexFunc(l.counts, func(have countSpec) bool { return have.perClient == c.perClient && have.part == c.part }); i >= 0 {
			return i
		}
		l.counts = append(l.counts, c)
		return len(l.counts) - 1
	}
	for i, rule := range l.rules {
		c := countSpec{perClient: rule.PerClient, rule: i}
		switch {
		case l.capped:
			c.part = i + 1
		case l.merged:
			c.part = l.layout.OfRule[i]
		}
		l.reads = append(l.reads, add(c))
		if l.merged && hasClientRule {
			add(countSpec{perClient: true, part: c.part, rule: i})
		}
	}
}

// now is the time in ms since the Unix epoch, on the monotonic clock from
// the wall time the counts were made at: it never goes back.
func (l *Counts) now() int64 {
	return (l.start.UnixNano() + time.Since(l.start).Nanoseconds()) / int64(time.Millisecond)
}

// shardOf returns the shard of a call's scopes: the resource's when a
// rule is per-resource, so that one lock covers the call.
func (l *Counts) shardOf(w who) *shard {
	h := w.resourceHash
	if l.clientScoped {
		h = mix(w.resourceHash, w.clientHash, 0)
	}
	return &l.shards[h%shardCount]
}

// Decide decides a call of weight n by client to resource: evaluate gets
// what each rule counts before the call, under the lock of the call's
// shard, and the call is recorded in every count if evaluate says so. The
// counts' Oldest are read only for a call some rule denies, the only
// one whose Result reads them (RetryAfter): an admitted call copies no
// call. The View is evaluate's only while it runs: its counts and their
// Oldest are the shard's scratch, which later calls reuse.
func (l *Counts) Decide(resource, client string, n int, evaluate func(limits.View) bool) {
	l.DecideCall(resource, limits.Call{Client: client, N: n}, evaluate)
}

// DecideCall is Decide of call c, which AtMost is judged and recorded at
// its Weight, the room the shard's counts leave it under the lock.
func (l *Counts) DecideCall(resource string, c limits.Call, evaluate func(limits.View) bool) {
	now := l.now()
	l.sweepNext(now)
	w := l.who(resource, c.Client)
	sh := l.shardOf(w)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweep(now, l.longest)
	v := sh.view(l, w, now)
	// No Result of a call that fits reads the counts' Oldest.
	n := c.Weight(l.rules, v.Counts)
	if !v.Fits(l.rules, n) {
		sh.readOldest(l, v, n)
	}
	if !evaluate(v) {
		return
	}
	for i, count := range l.counts {
		sh.record(l, i, count, w, n, now)
	}
}

// Peek returns what a call of weight n by client to resource would count
// now. The caller evaluates the view after the lock is let go, while other
// calls append to, merge, cap and rewrite the scopes' calls: so the view
// holds copies, of the counts (sh.counts is reused under mu) and of as
// many of each count's oldest calls as a judge can read (see readable).
func (l *Counts) Peek(resource, client string, n int) limits.View {
	w := l.who(resource, client)
	sh := l.shardOf(w)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.view(l, w, l.now())
	v.Counts = slices.Clone(v.Counts)
	for i, rule := range l.rules {
		most := l.maxN
		if n <= rule.Requests {
			most = max(most, n)
		}
		counted := sh.found[l.reads[i]].counted(sh.from[i])
		v.Counts[i].Oldest = entries(nil, counted[:readable(rule, v.Counts[i], most, counted)])
	}
	return v
}

// readOldest sets the Oldest of v's counts, in sh's scratch, for a call of
// weight n that some rule denies: as many of each count's oldest calls as
// its Result reads (see readable). The scratch is let go of after a
// denial that read more than oldestRoom calls, so that a shard does not
// keep the room of its longest read.
func (sh *shard) readOldest(l *Counts, v limits.View, n int) {
	if cap(sh.read) > oldestRoom {
		sh.read = nil
	}
	sh.read = sh.read[:0]
	for i, rule := range l.rules {
		counted := sh.found[l.reads[i]].counted(sh.from[i])
		start := len(sh.read)
		sh.read = entries(sh.read, counted[:readable(rule, v.Counts[i], n, counted)])
		v.Counts[i].Oldest = sh.read[start:len(sh.read):len(sh.read)]
	}
}

// oldestRoom is the most calls a shard's scratch for Oldest (shard.read)
// keeps the room of from one denial to the next.
const oldestRoom = 1024

// readable is how many of c's oldest calls (counted, oldest first)
// UntilRoom can read for a call of weight up to most, counted too if it
// is denied and recorded: those whose weight brings c's count, with the
// call's, down to room for it. Not the whole window, which may hold a
// million calls of a rule with room to spare. Peek asks for the heaviest
// call a Bucket admits (or a heavier one it judges all the same), a
// denial for its own.
func readable(rule limits.Rule, c limits.Count, most int, counted []call) int {
	// Less Requests first: with the call's weight twice, the count may
	// pass math.MaxInt, where a capped sum would read too few.
	over := limits.AddCapped(limits.AddCapped(c.Used-rule.Requests, most), most)
	i := 0
	for left := 0; i < len(counted) && left < over; i++ {
		left = limits.AddCapped(left, counted[i].weight)
	}
	return i
}

// view is what each rule counts for a call by client now, in sh's scratch
// counts, but their Oldest (see readOldest); it notes the scopes of the
// call's counts in sh.found, one map lookup each, and where each rule's
// count starts in sh.from.
func (sh *shard) view(l *Counts, w who, now int64) limits.View {
	for i, c := range l.counts {
		sh.found[i] = sh.scopes.find(l.keyOf(c, w))
	}
	v := limits.View{Now: now, Counts: sh.counts}
	for i, rule := range l.rules {
		v.Counts[i], sh.from[i] = sh.found[l.reads[i]].count(rule, now, l.longest)
		v.Counts[i].Stamp = l.stamp(l.counts[l.reads[i]], now)
	}
	return v
}

// stamp is when a call made at now starts to leave the windows of count
// c, less each window: now, or under a layout its interval's stamp in c's
// lane.
func (l *Counts) stamp(c countSpec, now int64) int64 {
	if l.merged {
		return l.layout.Lanes[c.part].Stamp(now)
	}
	return now
}

// record adds a call of weight n by client at now to count c, the i-th,
// in the scope the view found (sh.found), made if need be. The scope
// stays where it is in the list: a sweep moves it (see sweep).
func (sh *shard) record(l *Counts, i int, c countSpec, w who, n int, now int64) {
	s := sh.found[i]
	if s == nil {
		key, h := l.keyOf(c, w)
		s = sh.make(key, h, l.merged, now+l.reach)
	}
	s.written = now + l.reach // the scope is idle once its newest call left every window
	// A named scope keeps the client, for Flush.
	e := limits.Entry{At: l.stamp(c, now), Weight: n, Client: w.client}
	if !l.capped {
		s.trim(now, l.longest)
		s.add(e, l.merged)
		return
	}
	// As SortedSet's set of the rule: its window, then its newest
	// Requests.
	rule := l.rules[c.rule]
	s.trim(now, rule.Window)
	s.add(e, false)
	s.cap(rule.Requests)
}

// make returns the scope of key: a new one, listed at written, unless the
// count of another spec made it since the view (a per-client count of
// the client "" is the per-resource count). A per-resource scope names
// the client of each call, unless merged (see scope.clients).
func (sh *shard) make(key scopeKey, h uint64, merged bool, written int64) *scope {
	if s := sh.scopes.find(key, h); s != nil {
		return s
	}
	s := &scope{key: key, hash: h, named: !merged && key.client == ""}
	sh.scopes.add(s)
	sh.peak = max(sh.peak, len(sh.scopes))
	sh.list(s, written)
	return s
}

// sweepEvery is how many decisions make one sweep of another shard: the
// shards are swept in turn, so that a shard nobody calls any more is
// freed too, within SweepCycle decisions.
const sweepEvery = 8

// SweepCycle is how many decisions sweep every shard in turn: a scope
// nobody calls any more is freed within that many decisions, to any key,
// after its calls left every window (unless its shard's lock is busy
// when its turn comes).
const SweepCycle = sweepEvery * shardCount

// sweepNext sweeps the next shard in turn every sweepEvery calls, unless
// its lock is busy.
func (l *Counts) sweepNext(now int64) {
	turn := l.turns.Add(1)
	if turn%sweepEvery != 0 {
		return
	}
	sh := &l.shards[turn/sweepEvery%shardCount]
	if sh.mu.TryLock() {
		sh.sweep(now, l.longest)
		sh.mu.Unlock()
	}
}

// Sweep does what every decision does beside its own: every sweepEvery
// calls, it sweeps the next shard in turn. For a caller that decides
// mostly elsewhere (a Bucket's fallback, while Redis answers), so that
// the scopes of its last decisions are freed once they leave every
// window, though no decision comes here any more.
func (l *Counts) Sweep() { l.sweepNext(l.now()) }

// sweep frees the scopes that no window counts any more at now. A call
// does not move its scope in the list: a move writes to the scopes beside
// it, lines of memory most likely out of cache with many keys in use. The
// list is by when each scope was listed (made, or moved by a sweep), in
// order; sweep looks at those listed a window ago or more, frees the ones
// idle since, and lists the others again, at their newest call's stamp
// (written) or the newest listed's. So a scope in use moves once a
// window, not once a call; a scope called once is freed a window after
// its call, as before, and one called for longer within two windows of
// its newest call.
func (sh *shard) sweep(now, longest int64) {
	for s := sh.oldest; s != nil && s.listed+longest <= now; s = sh.oldest {
		sh.unlink(s)
		if s.written+longest > now {
			sh.list(s, s.written)
			continue
		}
		sh.scopes.remove(s)
	}
	sh.shrink()
}

// list puts s at the newest end of the list, listed at written, or at the
// newest's time if later, so that the list stays in order.
func (sh *shard) list(s *scope, written int64) {
	s.listed = written
	if sh.newest != nil {
		s.listed = max(written, sh.newest.listed)
	}
	sh.link(s)
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
func (sh *shard) shrink() {
	if sh.peak <= mapFloor || len(sh.scopes)*4 >= sh.peak {
		return
	}
	scopes := make(scopeMap, len(sh.scopes))
	for h, s := range sh.scopes {
		scopes[h] = s
	}
	sh.scopes, sh.peak = scopes, len(scopes)
}

func (sh *shard) link(s *scope) {
	s.prev, s.next = sh.newest, nil
	if sh.newest != nil {
		sh.newest.next = s
	} else {
		sh.oldest = s
	}
	sh.newest = s
}

func (sh *shard) unlink(s *scope) {
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

// drop deletes s.
func (sh *shard) drop(s *scope) {
	sh.unlink(s)
	sh.scopes.remove(s)
}

// Flush forgets client's calls at resource: its scopes, and its share of
// the resource's. Under a layout the resource's counts know a client's
// share only from its own counts, which a per-client rule makes: without
// one, the caller must refuse the Flush.
func (l *Counts) Flush(resource, client string) {
	w := l.who(resource, client)
	sh := l.shardOf(w)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, c := range l.counts {
		if s := sh.scopes.find(l.keyOf(c, w)); s != nil && !c.perClient {
			// Under a layout, the client's count of the same lane.
			mine := sh.scopes.find(l.keyOf(countSpec{perClient: true, part: c.part}, w))
			s.takeShare(client, mine, l.merged)
		}
	}
	for _, c := range l.counts {
		if s := sh.scopes.find(l.keyOf(c, w)); s != nil && c.perClient {
			sh.drop(s)
		}
	}
}

// FlushAll forgets every call at resource.
func (l *Counts) FlushAll(resource string) {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.scopes.each(func(s *scope) {
			if s.key.resource == resource {
				sh.drop(s)
			}
		})
		sh.shrink()
		sh.mu.Unlock()
	}
}

// SetRules makes rules the rules the counts are read for, and maxN the
// smallest of their Requests: rules that differ from the counts' own in
// Requests only (the same windows, scopes and precisions, and not
// capped, whose scopes hold the newest Requests calls), so that every
// count is kept. It takes every shard's lock, under which each reading
// of the rules runs.
func (l *Counts) SetRules(rules []limits.Rule, maxN int) {
	for i := range l.shards {
		l.shards[i].mu.Lock()
	}
	l.rules, l.maxN = rules, maxN
	for i := range l.shards {
		l.shards[i].mu.Unlock()
	}
}

// Keys names the scopes held, as "resource" or "resource client": what
// tests list in place of Redis keys.
func (l *Counts) Keys() []string {
	var out []string
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.scopes.each(func(s *scope) { out = append(out, strings.TrimSpace(s.key.resource+" "+s.key.client)) })
		sh.mu.Unlock()
	}
	return out
}
