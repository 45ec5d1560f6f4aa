package memorystore

import (
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// TATs are the buckets of one Bucket under GCRA, in this process: one TAT
// per rule and scope (limits.Bucket), exact, decided with the arithmetic
// of the Redis store, counted from the time of the decision. Every method may be
// called from any goroutine against any other.
type TATs struct {
	rules   []limits.Rule
	buckets []limits.Bucket // by rule
	kindOf  []int           // by rule: its bucket's kind, rules alike share one
	// byClient: every rule is per-client, so a call's buckets are its
	// client's, and its client picks its shard too.
	byClient bool
	start    time.Time
	seed     maphash.Seed
	turns    atomic.Uint64 // decisions made: see Sweep
	flushes  atomic.Uint64 // the generation: Flush and FlushAll made, see Refund
	shards   [shardCount]tatShard
}

// tatShard is one lock's share of the TATs.
type tatShard struct {
	mu   sync.Mutex
	tats map[tatKey]limits.TAT
	// counts is a view's, by rule: scratch, under mu, so that a decision
	// allocates no view.
	counts []limits.Count
	_      [64]byte
}

// tatSweepEvery is how many decisions pass between two sweeps, each of the
// next shard in turn, which drops its empty buckets: a sweep walks the
// shard's map, a 256th of the buckets, so it is paid for by as many
// decisions; every shard is swept once in shardCount*tatSweepEvery
// decisions, so that memory follows the buckets that hold something.
const tatSweepEvery = 256

// tatKey names a bucket: its kind, and its client ("" per resource).
type tatKey struct {
	resource, client string
	kind             int
}

// NewTATs returns empty buckets of rules; byClient: every rule is
// per-client.
func NewTATs(rules []limits.Rule, byClient bool) *TATs {
	t := &TATs{rules: rules, byClient: byClient, start: time.Now(), seed: maphash.MakeSeed()}
	var kinds []limits.Rule
	for _, r := range rules {
		b := limits.BucketOf(r)
		t.buckets = append(t.buckets, b)
		kind := limits.Rule{PerClient: r.PerClient, Requests: b.Burst, Window: b.Window, Rate: int(b.Rate)}
		at := slices.Index(kinds, kind)
		if at < 0 {
			at = len(kinds)
			kinds = append(kinds, kind)
		}
		t.kindOf = append(t.kindOf, at)
	}
	for i := range t.shards {
		t.shards[i].tats = map[tatKey]limits.TAT{}
		t.shards[i].counts = make([]limits.Count, len(rules))
	}
	return t
}

// now is the time in ms since the Unix epoch, on the monotonic clock from
// the wall time the TATs were made at: it never goes back.
func (t *TATs) now() int64 {
	return (t.start.UnixNano() + time.Since(t.start).Nanoseconds()) / int64(time.Millisecond)
}

func (t *TATs) shardOf(resource, client string) *tatShard {
	h := maphash.String(t.seed, resource)
	if t.byClient {
		h ^= maphash.String(t.seed, client) * 0x9e3779b97f4a7c15
	}
	return &t.shards[h%shardCount]
}

func (t *TATs) key(r int, resource, client string) tatKey {
	if !t.rules[r].PerClient {
		client = ""
	}
	return tatKey{resource: resource, client: client, kind: t.kindOf[r]}
}

// Decide decides a call of weight n by client to resource: evaluate gets
// what each rule's bucket holds, under the lock of the call's shard, and
// if it says so the call is counted in every bucket, from now. The View
// is evaluate's only while it runs: its counts are the shard's scratch.
func (t *TATs) Decide(resource, client string, n int, evaluate func(limits.View) bool) {
	t.DecideCall(resource, limits.Call{Client: client, N: n}, evaluate)
}

// DecideCall is Decide of call c, which AtMost is judged and counted at its
// Weight, the room the buckets leave it under the lock.
func (t *TATs) DecideCall(resource string, c limits.Call, evaluate func(limits.View) bool) {
	t.Sweep()
	client := c.Client
	sh := t.shardOf(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := t.now()
	v := t.view(sh, resource, client, c.N, now)
	// A bucket's Used is its level, whatever the weight: the view is
	// read again only for the weight's own stamp and RetryAfter.
	n := c.Weight(t.rules, v.Counts)
	if n != c.N {
		v = t.view(sh, resource, client, n, now)
	}
	if !evaluate(v) {
		return
	}
	for r, b := range t.buckets {
		k := t.key(r, resource, client)
		if !slices.Contains(t.kindOf[:r], k.kind) {
			sh.tats[k] = b.Advance(sh.tats[k], now, n)
		}
	}
}

// Refund gives back up to n units of a call of weight admitted by client
// to resource, decided at at (ms, this store's time, no later than it
// started to count), of which given (by rule, limits.Bucket.Giveback's
// cost) was given back before: in each bucket of the call, as much as
// the call may still hold there. It returns the cost given back by rule,
// and that in weight (limits.Givebacks).
func (t *TATs) Refund(resource, client string, at int64, admitted, n int, given []int64, gen string) ([]int64, int) {
	sh := t.shardOf(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if gen != t.Generation() {
		return make([]int64, len(t.buckets)), 0 // a Flush since took the call out
	}
	now := t.now()
	back, weight := limits.Givebacks(t.buckets, admitted, n, given, now-at)
	for r, b := range t.buckets {
		k := t.key(r, resource, client)
		if slices.Contains(t.kindOf[:r], k.kind) {
			continue // a bucket an earlier rule shares, given back once
		}
		if tat := b.Retreat(sh.tats[k], now, back[r]); tat.Empty(now) {
			delete(sh.tats, k)
		} else {
			sh.tats[k] = tat
		}
	}
	return back, weight
}

// view is what the buckets of a call hold at now; sh's lock is held. Its
// counts are sh's scratch, valid until the lock is let go.
func (t *TATs) view(sh *tatShard, resource, client string, n int, now int64) limits.View {
	v := limits.View{Now: now, Counts: sh.counts}
	for r, b := range t.buckets {
		v.Counts[r] = b.Count(sh.tats[t.key(r, resource, client)], now, n)
	}
	return v
}

// Sweep does what every decision does beside its own: every
// tatSweepEvery calls, it sweeps the next shard in turn. For a fallback,
// which decides here only while Redis is down, so that its buckets are
// freed once empty.
func (t *TATs) Sweep() {
	turn := t.turns.Add(1)
	if turn%tatSweepEvery != 0 {
		return
	}
	t.shards[turn/tatSweepEvery%shardCount].sweep(t.now())
}

// sweep drops sh's empty buckets.
func (sh *tatShard) sweep(now int64) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for k, tat := range sh.tats {
		if tat.Empty(now) {
			delete(sh.tats, k)
		}
	}
}

// Peek returns what the buckets of a call of weight n hold now, in counts
// of its own.
func (t *TATs) Peek(resource, client string, n int) limits.View {
	sh := t.shardOf(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := t.view(sh, resource, client, n, t.now())
	v.Counts = slices.Clone(v.Counts)
	return v
}

// Generation is the count of Flush and FlushAll calls: a Refund of a call
// decided in another generation gives nothing back, as a Flush since took
// it out (of any resource's: rare, and never too much given back).
func (t *TATs) Generation() string { return strconv.FormatUint(t.flushes.Load(), 10) }

// Flush empties client's own buckets; a per-resource bucket keeps no
// client's share, and stays as it is. The generation changes first, so
// that a Refund after it gives nothing back.
func (t *TATs) Flush(resource, client string) {
	t.flushes.Add(1)
	sh := t.shardOf(resource, client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for r, rule := range t.rules {
		if rule.PerClient {
			delete(sh.tats, t.key(r, resource, client))
		}
	}
}

// FlushAll empties every bucket of resource: in its shard, or, where
// every rule is per-client, in each, once the generation changed.
func (t *TATs) FlushAll(resource string) {
	t.flushes.Add(1)
	if !t.byClient {
		t.shardOf(resource, "").flush(resource)
		return
	}
	for i := range t.shards {
		t.shards[i].flush(resource)
	}
}

// flush empties every bucket of resource in sh.
func (sh *tatShard) flush(resource string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for k := range sh.tats {
		if k.resource == resource {
			delete(sh.tats, k)
		}
	}
}

// Keys names the buckets held, as "resource" or "resource client": what
// tests list in place of Redis keys.
func (t *TATs) Keys() []string {
	var out []string
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k := range sh.tats {
			out = append(out, strings.TrimSpace(k.resource+" "+k.client))
		}
		sh.mu.Unlock()
	}
	return out
}
