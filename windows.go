package leakybucket

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// windowsStrategy is Windows(precision), or FixedWindows if fixed.
type windowsStrategy struct {
	precision time.Duration
	fixed     bool
}

// String returns "windows(1s)", or "fixed windows".
func (w windowsStrategy) String() string {
	if w.fixed {
		return "fixed windows"
	}
	return "windows(" + w.precision.String() + ")"
}

// MaxWindowsRequests bounds the Requests of a rule under Windows, so that
// no interval's HINCRBY can overflow, even with a thousand calls of the
// largest weight not yet taken back.
const MaxWindowsRequests = 1 << 50

func (w windowsStrategy) newStore(p plan) (store, error) {
	if !w.fixed && w.precision < time.Millisecond {
		return nil, invalidStrategy(w, "%w: %v is under 1ms (FixedWindows makes the rules without a precision fixed windows)", ErrInvalidPrecision, w.precision)
	}
	for _, r := range p.rules {
		if r.Limit.Requests > MaxWindowsRequests {
			return nil, invalidStrategy(w, "rule %v: more than MaxWindowsRequests (%d)", r, MaxWindowsRequests)
		}
		if r.Limit.Precision != 0 || w.fixed {
			continue // its own precision (checked by New), or a fixed window
		}
		if err := checkPrecision(w.precision, r.Limit.Window); err != nil {
			return nil, invalidStrategy(w, "rule %v: %w", r, err)
		}
	}
	return windowsStore{plan: p, layout: newLayout(w.precision, p.rules), gens: &sync.Map{}}, nil
}

// windowsStore is the Windows strategy: precision-bucket sliding windows,
// and fixed ones, decided in one fenced MULTI/EXEC without a lock
// (round.go). Each hash maps an interval to the weight added in it, per
// span of the rules' intervals (intervals.go), and one hash serves every
// rule of its scope: a rule counts the intervals of its span whose stamp
// is inside its window. The resource's hash exists when a rule is
// per-resource, each client's when a rule is per-client. Per batch, the
// transaction reads the resource's generation (GET, see below), adds the
// batch's weight to the current interval of each span of each hash
// (HINCRBY), reads every hash (HGETALL) and sets it to expire with the
// current interval. The intervals that left every window are deleted
// later, a few at a time (tidyAt).
//
// The calls are then judged in order: each counts the intervals read, less
// the batch's own weight, plus the weight of the batch's calls admitted
// before it. So a call sees every call decided before it, in this process
// or any other (transactions run one at a time), and nothing else. The
// weight of the calls not recorded is then taken back (HINCRBY of minus
// it), in a second fenced transaction: until it lands, others count it, at
// worst denied for that round trip.
//
// A take-back must never apply to a hash made again by a flush, or the
// count would go below what was admitted. So the hashes are named by a
// generation, which FlushAll bumps (INCR): a decision or take-back that
// raced a FlushAll writes to the old generation's hashes, which nothing
// reads and which expire. A decision that wrote to an old generation
// (its process had not seen the flush yet) is made again.
type windowsStore struct {
	plan
	layout
	gens *sync.Map // by resource (keyspace.base): the latest generation seen
}

// gen is the generation of keys' hashes as last seen.
func (s windowsStore) gen(keys keyspace) string {
	if g, ok := s.gens.Load(keys.base); ok {
		return g.(string)
	}
	return ""
}

// saw records the generation read with a decision, and reports whether it
// is the one the decision wrote to.
func (s windowsStore) saw(keys keyspace, used string, reply any) bool {
	seen, _ := reply.(string)
	if seen == used {
		return true
	}
	if seen == "" {
		s.gens.Delete(keys.base)
	} else {
		s.gens.Store(keys.base, seen)
	}
	return false
}

// hashes returns the hashes a call by client writes and reads, in
// generation gen: the resource's first.
func (s windowsStore) hashes(keys keyspace, gen, client string) []string {
	var out []string
	if !s.clientScoped {
		out = append(out, keys.hash(gen))
	}
	if s.hasClientRule {
		out = append(out, keys.clientHash(gen, client))
	}
	return out
}

// hashOf is the index, among a call's hashes, of the one rule counts in.
func (s windowsStore) hashOf(rule Rule) int {
	if rule.Scope == ScopeClient && !s.clientScoped {
		return 1
	}
	return 0
}

// errStaleGeneration: a decision wrote to the hashes of a generation that
// a FlushAll had ended, which nothing reads: it is made again.
var errStaleGeneration = fmt.Errorf("%w: the counts were flushed meanwhile", errRedo)

// staleRetries bounds how often a read is made again after a flush.
const staleRetries = 3

func (s windowsStore) decide(ctx context.Context, at site, calls []request, judge judgeFunc) error {
	return decideRound(ctx, at, func(now int64) round { return s.newBatch(at.keys, now, calls) }, judge)
}

// hBatch is the round of one batch on the hashes of a resource.
type hBatch struct {
	windowsStore
	keys     keyspace
	gen      string
	now      int64
	calls    []request
	byKey    map[string]*hash
	order    []*hash
	genReply int
}

// hash is one hash of a batch: its weight in the batch, where its read is
// among the replies, then its intervals.
type hash struct {
	key   string
	added int // the batch's weight
	read  int

	lanes    [][]logEntry // by lane: the intervals other than the current ones, stamped for it, oldest first
	current  []int        // by span: the current interval's weight before the batch
	admitted int          // the batch's weight admitted so far
	denied   int          // the batch's weight to take back
	dead     []any        // fields no window counts any more

	// Room for lanes and current in the usual case, one lane, so that
	// reading a hash allocates no more than the intervals it holds.
	laneRoom    [1][]logEntry
	currentRoom [1]int
}

func (s windowsStore) newBatch(keys keyspace, now int64, calls []request) *hBatch {
	b := &hBatch{windowsStore: s, keys: keys, gen: s.gen(keys), now: now, calls: calls, byKey: map[string]*hash{}}
	for _, c := range calls {
		for _, key := range s.hashes(keys, b.gen, c.client) {
			h := b.byKey[key]
			if h == nil {
				h = &hash{key: key}
				b.byKey[key] = h
				b.order = append(b.order, h)
			}
			h.added += c.n
		}
	}
	return b
}

func (b *hBatch) queue(t *txn) {
	b.genReply = t.add("get", b.keys.generation())
	for _, h := range b.order {
		for g := range b.spans {
			t.add("hincrby", h.key, b.current(g, b.now), h.added)
		}
		h.read = t.add("hgetall", h.key)
		t.add("pexpireat", h.key, b.expireAt(b.now))
	}
}

// tidyAt is how many dead intervals a hash may hold before a decision that
// read them deletes them (HDEL). Deleting the intervals that might have
// died in every transaction would cost a command per hash for nothing most
// of the time, and miss those that died while nobody called; this way a
// hash holds at most tidyAt-1 dead intervals beyond those of its longest
// window, and they cost a round trip once per tidyAt deaths at most.
const tidyAt = 16

// judge asks judge about each call in order, and queues on back the
// take-back of the calls not recorded, and the deletion of dead fields the
// transaction did not delete.
func (b *hBatch) judge(t *txn, judge judgeFunc, back *txn, now int64) error {
	if !b.saw(b.keys, b.gen, t.replies[b.genReply]) {
		return errStaleGeneration
	}
	for _, h := range b.order {
		h.parse(b.layout, b.now, replyFields(t.replies[h.read]))
		for g := range h.current {
			h.current[g] -= h.added
		}
	}
	for i, c := range b.calls {
		keys := b.hashes(b.keys, b.gen, c.client)
		v := view{now: now, counts: make([]count, len(b.rules))}
		for r, rule := range b.rules {
			h := b.byKey[keys[b.hashOf(rule)]]
			v.counts[r] = h.count(b.layout, r, rule, b.now, now, h.admitted)
		}
		recorded := judge(i, v)
		for _, key := range keys {
			if recorded {
				b.byKey[key].admitted += c.n
			} else {
				b.byKey[key].denied += c.n
			}
		}
	}
	b.queueBack(back, func(h *hash) int { return h.denied })
	return nil
}

func (b *hBatch) idempotent() bool { return false }

// takeAll queues the take-back of the batch's whole weight.
func (b *hBatch) takeAll(back *txn) {
	b.queueBack(back, func(h *hash) int { return h.added })
}

// queueBack queues, per hash, the take-back of weight(h), and the deletion
// of the dead fields read if there is a take-back to carry it or enough of
// them (tidyAt).
func (b *hBatch) queueBack(back *txn, weight func(*hash) int) {
	tidy := false
	for _, h := range b.order {
		if n := weight(h); n > 0 {
			for g := range b.spans {
				back.add("hincrby", h.key, b.current(g, b.now), -n)
			}
			// A take-back that raced a FlushAll makes an old generation's
			// hash again: let it expire.
			back.add("pexpireat", h.key, b.expireAt(b.now))
		}
		tidy = tidy || len(h.dead) >= tidyAt
	}
	if len(back.cmds) == 0 && !tidy {
		return
	}
	for _, h := range b.order {
		if len(h.dead) > 0 {
			back.add(append([]any{"hdel", h.key}, h.dead...)...)
		}
	}
}

// parse reads a hash's fields at now: its intervals, and the fields no
// window counts any more. Fields that are not an interval are not ours.
func (h *hash) parse(y layout, now int64, fields iter.Seq2[string, string]) {
	h.lanes, h.current = h.laneRoom[:], h.currentRoom[:]
	if len(y.lanes) > len(h.laneRoom) {
		h.lanes, h.current = make([][]logEntry, len(y.lanes)), make([]int, len(y.spans))
	}
	for field, value := range fields {
		g, index, ok := y.interval(field)
		n, err := strconv.Atoi(value)
		switch {
		case !ok || err != nil:
		case index <= y.lastDead(g, now):
			h.dead = append(h.dead, field)
		case index == now/y.spans[g]:
			h.current[g] = n
		case n > 0:
			for _, l := range y.lanesOf[g] {
				h.lanes[l] = append(h.lanes[l], logEntry{id: field, at: y.lanes[l].at(index), weight: n})
			}
		}
	}
	for l, entries := range h.lanes {
		slices.SortFunc(entries, func(a, b logEntry) int { return cmp.Compare(a.at, b.at) })
		h.lanes[l] = slices.Grow(entries, 1) // room for withCurrent
	}
}

// count is what rule r counts in h at now, for a call made at at (now, or
// the batch's estimate of it, which chose the interval the call was added
// to) with extra weight in its interval on top of what the hash held.
//
// A fixed rule counts at at, not now: a call whose estimate was still in
// the last window when Redis ran the transaction in the next was added to
// the last window's interval, and must be judged with the calls of that
// window, or the next would admit it uncounted.
func (h *hash) count(y layout, r int, rule Rule, at, now int64, extra int) count {
	l := y.lane(r)
	stamp := l.stamp(at)
	if l.fixed {
		now = at
	}
	c := countOf(rule, withCurrent(h.lanes[y.ofRule[r]], stamp, h.current[l.group]+extra), now)
	c.stamp = stamp
	return c
}

// withCurrent returns a lane's intervals with the current one, stamped at
// stamp, holding weight. It is the newest unless another process wrote to
// a later interval (its estimate of Redis's clock is ahead of this one's);
// then the intervals are copied, else the current one goes in the room
// parse left, so that a batch judges its calls without allocating: the
// result is valid until the next call.
func withCurrent(entries []logEntry, stamp int64, weight int) []logEntry {
	if weight <= 0 {
		return entries
	}
	if n := len(entries); n == 0 || entries[n-1].at < stamp {
		return append(entries, logEntry{at: stamp, weight: weight})
	}
	at, _ := slices.BinarySearchFunc(entries, stamp, func(e logEntry, t int64) int { return cmp.Compare(e.at, t) })
	out := make([]logEntry, 0, len(entries)+1)
	out = append(append(append(out, entries[:at]...), logEntry{at: stamp, weight: weight}), entries[at:]...)
	return out
}

// read reads the generation, the hashes of client and TIME on conn in one
// round trip; once more if the generation was not the one expected.
func (s windowsStore) read(ctx context.Context, conn pipeliner, at site, client string, watch bool) (int64, []*hash, error) {
	ks := at.keys
	for range staleRetries {
		gen := s.gen(ks)
		keys := s.hashes(ks, gen, client)
		reads := make([]*redis.MapStringStringCmd, len(keys))
		var seen *redis.StringCmd
		var clock *redis.TimeCmd
		sent := time.Now()
		_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			if watch {
				// The client's hash and the generation: see flush.
				pipe.Do(ctx, "watch", keys[len(keys)-1], ks.generation())
			}
			seen = pipe.Get(ctx, ks.generation())
			for i, key := range keys {
				reads[i] = pipe.HGetAll(ctx, key)
			}
			clock = pipe.Time(ctx)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, nil, err
		}
		if !s.saw(ks, gen, seen.Val()) {
			continue
		}
		at.clock.sample(clock.Val(), sent)
		now := clock.Val().UnixMilli()
		hashes := make([]*hash, len(keys))
		for i, read := range reads {
			hashes[i] = &hash{key: keys[i]}
			hashes[i].parse(s.layout, now, maps.All(read.Val()))
		}
		return now, hashes, nil
	}
	return 0, nil, errStaleGeneration
}

func (s windowsStore) peek(ctx context.Context, at site, client string, _ int) (view, error) {
	now, hashes, err := s.read(ctx, at.node, at, client, false)
	if err != nil {
		return view{}, err
	}
	v := view{now: now, counts: make([]count, len(s.rules))}
	for r, rule := range s.rules {
		v.counts[r] = hashes[s.hashOf(rule)].count(s.layout, r, rule, now, now, 0)
	}
	return v, nil
}

// errNoClientShare: see Bucket.Flush.
var errNoClientShare = fmt.Errorf("leakybucket: %w: Windows keeps no per-client counts when every rule is per-resource, so Flush cannot tell a client's share: use FlushAll", errors.ErrUnsupported)

// flushRetries bounds how often Flush reads again after a decision of the
// client changed its counts meanwhile.
const flushRetries = 5

// flush deletes the client's hash and takes its share out of the
// resource's, in a transaction fenced by WATCH on the client's hash and
// the generation: a decision or a flush that changed them meanwhile makes
// it read again, so that no share is taken out twice.
func (s windowsStore) flush(ctx context.Context, at site, client string) error {
	if !s.hasClientRule {
		return errNoClientShare
	}
	for range flushRetries {
		gen := s.gen(at.keys)
		keys := s.hashes(at.keys, gen, client)
		err := at.node.Watch(ctx, func(tx *redis.Tx) error {
			now, hashes, err := s.read(ctx, tx, at, client, true)
			if err != nil {
				_ = tx.Unwatch(ctx).Err() // else a later EXEC on the connection would abort
				return err
			}
			if s.gen(at.keys) != gen {
				return redis.TxFailedErr // read again, watching the new hashes
			}
			_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Del(ctx, keys[len(keys)-1])
				if !s.clientScoped {
					s.takeShare(ctx, pipe, keys[0], hashes[len(hashes)-1], now)
				}
				return nil
			})
			return err
		})
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("leakybucket: Flush raced the client's decisions %d times: %w", flushRetries, redis.TxFailedErr)
}

// takeShare queues the subtraction of mine's live intervals from the
// resource's hash: of each span's, as the span's first lane holds them.
func (s windowsStore) takeShare(ctx context.Context, pipe redis.Pipeliner, resource string, mine *hash, now int64) {
	for g, span := range s.spans {
		current := logEntry{id: s.fieldName(g, now/span), weight: mine.current[g]}
		for _, e := range append(mine.lanes[s.lanesOf[g][0]], current) {
			if e.weight > 0 {
				pipe.HIncrBy(ctx, resource, e.id, -int64(e.weight))
			}
		}
	}
	pipe.PExpireAt(ctx, resource, time.UnixMilli(s.expireAt(now)))
}

// flushAll starts a new generation, and deletes the hashes of the resource
// (with SCAN when a rule is per-client): a decision or take-back that
// raced it writes to the old generation, which nothing reads. The
// generation's key outlives the longest window and the latest take-back
// (resolveFor, takeBackFor), so that no decision counts with what a late
// take-back wrote to a generation before.
func (s windowsStore) flushAll(ctx context.Context, at site) error {
	keys := []string{at.keys.hash(s.gen(at.keys))}
	if s.hasClientRule {
		r := newKeyScan(at.keys.hashes(), s.scanCount)
		if err := r.finish(ctx, at.node); err != nil {
			return err
		}
		keys = r.found
	}
	var bumped *redis.IntCmd
	_, err := at.node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		bumped = pipe.Incr(ctx, at.keys.generation())
		pipe.PExpire(ctx, at.keys.generation(), time.Duration(s.longest)*time.Millisecond+resolveFor+takeBackFor)
		if len(keys) > 0 {
			pipe.Del(ctx, keys...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.gens.Store(at.keys.base, strconv.FormatInt(bumped.Val(), 10))
	return at.route.owns(ctx, at.node, at.keys)
}

// tag is the layout's: see layout.tag.
func (s windowsStore) tag() string { return s.layout.tag() }
