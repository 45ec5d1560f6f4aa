package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// NewWindows returns the store of Windows(precision) for p: of
// FixedWindows if precision is 0.
func NewWindows(p Plan, precision time.Duration) Store {
	return windowsStore{Plan: p, Layout: intervals.New(precision, p.Rules), gens: &sync.Map{}}
}

// windowsStore is the Windows strategy: precision-bucket sliding windows,
// and fixed ones, decided in one fenced MULTI/EXEC without a lock
// (round.go). Each hash maps an interval to the weight added in it, per
// span of the rules' intervals (package intervals), and one hash serves every
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
// or any other (transactions run one at a time), and nothing else. Only
// calls that every rule showed this process room for are written
// (package foresight); the weight of those not recorded is then taken back
// (HINCRBY of minus it), in a second fenced transaction, under a guard of
// the client's hash (see txn.Guard) where there is one: until it lands,
// others count it.
//
// A take-back must never apply to a hash made again by a flush, or the
// count would go below what was admitted. So the hashes are named by a
// generation, which FlushAll bumps (INCR): a decision or take-back that
// raced a FlushAll writes to the old generation's hashes, which nothing
// reads and which expire; and a client's hash carries an incarnation,
// which Flush ends with the hash. A decision that wrote to an old
// generation (its process had not seen the flush yet) is made again.
type windowsStore struct {
	Plan
	intervals.Layout
	lockFree
	gens *sync.Map // by resource (keys.Space.base): the latest generation seen
}

// gen is the generation of keys' hashes as last seen.
func (s windowsStore) gen(ks keys.Space) string {
	if g, ok := s.gens.Load(ks.Slot()); ok {
		return g.(string)
	}
	return ""
}

// saw records the generation read with a decision, and reports whether it
// is the one the decision wrote to.
func (s windowsStore) saw(ks keys.Space, used string, reply any) bool {
	seen, _ := reply.(string)
	if seen == used {
		return true
	}
	if seen == "" {
		s.gens.Delete(ks.Slot())
	} else {
		s.gens.Store(ks.Slot(), seen)
	}
	return false
}

// hashes returns the hashes a call by client writes and reads, in
// generation gen: the resource's first.
func (s windowsStore) hashes(ks keys.Space, gen, client string) []string {
	var out []string
	if !s.ClientScoped {
		out = append(out, ks.Hash(gen))
	}
	if s.HasClientRule {
		out = append(out, ks.ClientHash(gen, client))
	}
	return out
}

// hashOf is the index, among a call's hashes, of the one rule counts in.
func (s windowsStore) hashOf(rule limits.Rule) int {
	if rule.PerClient && !s.ClientScoped {
		return 1
	}
	return 0
}

// errStaleGeneration: a decision wrote to the hashes of a generation that
// a FlushAll had ended, which nothing reads: it is made again.
var errStaleGeneration = fmt.Errorf("%w: the counts were flushed meanwhile", errRedo)

// staleRetries bounds how often a read is made again after a flush.
const staleRetries = 3

func (s windowsStore) Decide(ctx context.Context, where Site, calls []limits.Call, judge Judge) error {
	return decideRound(ctx, where, func(now int64) round { return s.newBatch(where.Keys, now, calls) }, judge)
}

// hBatch is the round of one batch on the hashes of a resource.
type hBatch struct {
	windowsStore
	keys     keys.Space
	gen      string
	now      int64
	calls    []limits.Call
	byKey    map[string]*hash
	order    []*hash
	ofCalls  []*hash // each call's hashes, as hashes names them: found once, not by name per call
	genReply int
	token    string // the incarnation of the clients' hashes it makes
}

// hash is one hash of a batch: its weight in the batch, where its read is
// among the replies, then its intervals.
type hash struct {
	key    string
	client bool // a client's hash, not the resource's
	added  int  // the batch's weight written to it
	read   int

	incarnation string           // a client's hash's, as read: see txn.Guard
	lanes       [][]limits.Entry // by lane: the intervals other than the current ones, stamped for it, oldest first
	current     []int            // by span: the current interval's weight before the batch
	admitted    int              // the batch's weight admitted so far
	denied      int              // the batch's weight to take back
	dead        []string         // fields no window counts any more

	// Room for lanes and current in the usual case, one lane, so that
	// reading a hash allocates no more than the intervals it holds.
	laneRoom    [1][]limits.Entry
	currentRoom [1]int
}

func (s windowsStore) newBatch(ks keys.Space, now int64, calls []limits.Call) *hBatch {
	b := &hBatch{windowsStore: s, keys: ks, gen: s.gen(ks), now: now, calls: calls, byKey: map[string]*hash{},
		ofCalls: make([]*hash, 0, 2*len(calls)),
		token:   strconv.FormatUint(rand.Uint64(), 36)}
	for _, c := range calls {
		hashKeys := s.hashes(ks, b.gen, c.Client)
		for i, key := range hashKeys {
			h := b.byKey[key]
			if h == nil {
				h = &hash{key: key, client: s.HasClientRule && i == len(hashKeys)-1}
				b.byKey[key] = h
				b.order = append(b.order, h)
			}
			if !c.Look {
				h.added += c.N
			}
			b.ofCalls = append(b.ofCalls, h)
		}
	}
	return b
}

// hashesOf returns call i's hashes, as hashes orders them.
func (b *hBatch) hashesOf(i int) []*hash {
	n := len(b.ofCalls) / len(b.calls)
	return b.ofCalls[i*n : (i+1)*n]
}

func (b *hBatch) queue(t *txn.Txn) {
	b.genReply = t.Add("get", b.keys.Generation())
	wrote := false
	for _, h := range b.order {
		wrote = wrote || h.added > 0
		key := any(h.key) // boxed once for its commands
		if h.added > 0 {
			if h.client {
				t.Add("hsetnx", key, txn.IncarnationField, b.token)
			}
			for g := range b.Spans {
				t.Add("hincrby", key, b.Current(g, b.now), h.added)
			}
		}
		h.read = t.Add("hgetall", key)
		if h.added > 0 {
			for _, cmd := range txn.ExtendTo(h.key, b.ExpireAt(b.now)) {
				t.Add(cmd...)
			}
		}
	}
	if wrote && b.gen != "" {
		// The generation outlives every hash of its own (see flushAll).
		t.Add("pexpireat", b.keys.Generation(), b.ExpireAt(b.now), "gt")
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
func (b *hBatch) judge(t *txn.Txn, judge Judge, back *txn.Txn, now int64) error {
	if !b.saw(b.keys, b.gen, t.Replies[b.genReply]) {
		return errStaleGeneration
	}
	for _, h := range b.order {
		h.parse(b.Layout, b.now, txn.ReplyFields(t.Replies[h.read]), txn.ReplyLen(t.Replies[h.read]))
		for g := range h.current {
			h.current[g] -= h.added
		}
	}
	for i, c := range b.calls {
		hashes := b.hashesOf(i)
		v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
		for r, rule := range b.Rules {
			h := hashes[b.hashOf(rule)]
			v.Counts[r] = h.count(b.Layout, r, rule, b.now, now, h.admitted)
		}
		recorded := judge(i, v)
		for _, h := range hashes {
			switch {
			case c.Look: // it wrote nothing
			case recorded:
				h.admitted += c.N
			default:
				h.denied += c.N
			}
		}
	}
	b.queueBack(back, func(h *hash) int { return h.denied })
	return nil
}

func (b *hBatch) idempotent() bool { return false }

// takeAll queues the take-back of the batch's whole weight. Where t's
// replies are known, the clients' hashes are known by their incarnation
// as read; else only if the batch made them (see txn.Guard).
func (b *hBatch) takeAll(t, back *txn.Txn) {
	for _, h := range b.order {
		if t.Replies != nil {
			h.incarnation = incarnation(txn.ReplyFields(t.Replies[h.read]))
		}
	}
	b.queueBack(back, func(h *hash) int { return h.added })
}

// incarnation finds a hash's incarnation among its fields.
func incarnation(fields iter.Seq2[string, string]) string {
	for field, value := range fields {
		if field == txn.IncarnationField {
			return value
		}
	}
	return ""
}

// queueBack queues the take-back of weight(h) from each hash h, and the
// deletion of the dead fields read if there is a take-back to carry it or
// enough of them (tidyAt). The weight a client's hash holds is taken out
// of it and of the resource's under a guard (see txn.Guard): not after a Flush
// took it out with the client's hash.
func (b *hBatch) queueBack(back *txn.Txn, weight func(*hash) int) {
	tidy := false
	for _, h := range b.order {
		tidy = tidy || len(h.dead) >= tidyAt
		n := weight(h)
		switch {
		case n <= 0:
		case h.client:
			back.Guards = append(back.Guards, b.guardOf(h, n))
		case !b.HasClientRule:
			back.Cmds = b.subtract(back.Cmds, h, n)
		}
	}
	if len(back.Cmds) > 0 || len(back.Guards) > 0 || tidy {
		b.queueTidy(back)
	}
}

// queueTidy queues the deletion of the dead fields read.
func (b *hBatch) queueTidy(back *txn.Txn) {
	for _, h := range b.order {
		if len(h.dead) > 0 {
			cmd := append(make([]any, 0, 2+len(h.dead)), "hdel", h.key)
			for _, field := range h.dead {
				cmd = append(cmd, field)
			}
			back.Cmds = append(back.Cmds, cmd)
		}
	}
}

// guardOf is the take-back of n from h, a client's hash, and from the
// resource's if a rule is per-resource: under a guard of h's incarnation,
// as read, or as the batch made it.
func (b *hBatch) guardOf(h *hash, n int) txn.Guard {
	g := txn.Guard{Key: h.key, Want: []string{b.token}}
	if h.incarnation != "" {
		g.Want = append(g.Want, h.incarnation)
	}
	g.Cmds = b.subtract(g.Cmds, h, n)
	if resource := b.byKey[b.keys.Hash(b.gen)]; resource != nil {
		g.Cmds = b.subtract(g.Cmds, resource, n)
	}
	return g
}

// subtract appends to cmds the commands that take n out of h's current
// intervals.
func (b *hBatch) subtract(cmds [][]any, h *hash, n int) [][]any {
	for g := range b.Spans {
		cmds = append(cmds, []any{"hincrby", h.key, b.Current(g, b.now), -n})
	}
	// A hash gone meanwhile (it expired, or a FlushAll deleted it) is not
	// made again.
	return append(cmds, txn.DropIfMade(h.key))
}

// parse reads a hash's fields at now, of which there are size: its
// intervals, and the fields no window counts any more. Fields that are not
// an interval are not ours.
func (h *hash) parse(y intervals.Layout, now int64, fields iter.Seq2[string, string], size int) {
	h.clear(y, size)
	first := y.Bounds(0, now)
	for field, value := range fields {
		g, index, ok := y.Interval(field)
		if !ok {
			// Not parsed: the incarnation's value is no number, and a
			// failed parse allocates its error.
			h.other(field, value)
			continue
		}
		n, err := strconv.Atoi(value)
		live := first // the usual case, found once
		if g != 0 {
			live = y.Bounds(g, now)
		}
		switch {
		case err != nil: // not ours
		case index <= live.Dead:
			h.dead = append(h.dead, field)
		case index == live.Current:
			h.current[g] = n
		case n > 0:
			for _, l := range y.LanesOf[g] {
				h.lanes[l] = append(h.lanes[l], limits.Entry{ID: field, At: y.Lanes[l].At(index), Weight: n})
			}
		}
	}
	for l, entries := range h.lanes {
		sortStamps(entries, y.Lanes[l].Span)
		h.lanes[l] = entries
	}
}

// clear empties h for parse, with room for size fields.
func (h *hash) clear(y intervals.Layout, size int) {
	h.lanes, h.current = h.laneRoom[:], h.currentRoom[:]
	if len(y.Lanes) > len(h.laneRoom) {
		h.lanes, h.current = make([][]limits.Entry, len(y.Lanes)), make([]int, len(y.Spans))
	}
	for l := range h.lanes {
		// Room for every field, and for withCurrent: one allocation,
		// not one per doubling.
		h.lanes[l] = make([]limits.Entry, 0, size+1)
	}
	h.incarnation = ""
}

// stampSlots bounds the span offsets sortStamps places by counting; 4096
// covers a window of 4096 precisions (a minute at 15 ms), on the stack.
const stampSlots = 4096

// sortStamps orders a lane's intervals oldest first. Redis returns a hash's
// fields in an order of its own, and go-redis reads a RESP3 map into a Go
// map, whose order is random: sorting them was a tenth of a steady
// decision's time. The stamps of a lane are distinct and a multiple of its
// span apart, so each interval's place is how many stamps lie below its
// own: counted on a bitmap of their offsets, in linear time, and the
// intervals moved there in place. Stamps that are not so (no field of ours
// is) or too far apart are sorted as before.
func sortStamps(entries []limits.Entry, span int64) {
	if slices.IsSortedFunc(entries, byStamp) {
		return
	}
	lo := slices.MinFunc(entries, byStamp).At
	var slots [stampSlots / 64]uint64
	for _, e := range entries {
		off := (e.At - lo) / span
		if (e.At-lo)%span != 0 || off >= stampSlots || slots[off/64]&(1<<(off%64)) != 0 {
			slices.SortFunc(entries, byStamp)
			return
		}
		slots[off/64] |= 1 << (off % 64)
	}
	var below [stampSlots / 64]int // stamps in the words before each
	for w := 1; w < len(below); w++ {
		below[w] = below[w-1] + bits.OnesCount64(slots[w-1])
	}
	place := func(e limits.Entry) int {
		off := (e.At - lo) / span
		return below[off/64] + bits.OnesCount64(slots[off/64]&(1<<(off%64)-1))
	}
	for i := range entries {
		// Each swap puts one interval in its place for good.
		for p := place(entries[i]); p != i; p = place(entries[i]) {
			entries[i], entries[p] = entries[p], entries[i]
		}
	}
}

func byStamp(a, b limits.Entry) int { return cmp.Compare(a.At, b.At) }

// other reads a field that is not an interval: the incarnation, or not
// ours.
func (h *hash) other(field, value string) {
	if field == txn.IncarnationField {
		h.incarnation = value
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
func (h *hash) count(y intervals.Layout, r int, rule limits.Rule, at, now int64, extra int) limits.Count {
	l := y.Lane(r)
	stamp := l.Stamp(at)
	if l.Fixed {
		now = at
	}
	c := rule.CountOf(withCurrent(h.lanes[y.OfRule[r]], stamp, h.current[l.Group]+extra), now)
	c.Stamp = stamp
	return c
}

// withCurrent returns a lane's intervals with the current one, stamped at
// stamp, holding weight. It is the newest unless another process wrote to
// a later interval (its estimate of Redis's clock is ahead of this one's);
// then the intervals are copied, else the current one goes in the room
// parse left, so that a batch judges its calls without allocating: the
// result is valid until the next call.
func withCurrent(entries []limits.Entry, stamp int64, weight int) []limits.Entry {
	if weight <= 0 {
		return entries
	}
	if n := len(entries); n == 0 || entries[n-1].At < stamp {
		return append(entries, limits.Entry{At: stamp, Weight: weight})
	}
	at, _ := slices.BinarySearchFunc(entries, stamp, func(e limits.Entry, t int64) int { return cmp.Compare(e.At, t) })
	out := make([]limits.Entry, 0, len(entries)+1)
	out = append(append(append(out, entries[:at]...), limits.Entry{At: stamp, Weight: weight}), entries[at:]...)
	return out
}

// read reads the generation, the hashes of client and TIME on conn in one
// round trip; once more if the generation was not the one expected.
func (s windowsStore) read(ctx context.Context, conn pipeliner, where Site, client string) (int64, []*hash, error) {
	ks := where.Keys
	for range staleRetries {
		gen := s.gen(ks)
		keys := s.hashes(ks, gen, client)
		reads := make([]*redis.MapStringStringCmd, len(keys))
		var seen *redis.StringCmd
		var serverTime *redis.TimeCmd
		sent := time.Now()
		_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			seen = pipe.Get(ctx, ks.Generation())
			for i, key := range keys {
				reads[i] = pipe.HGetAll(ctx, key)
			}
			serverTime = pipe.Time(ctx)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return 0, nil, err
		}
		if !s.saw(ks, gen, seen.Val()) {
			continue
		}
		where.Clock.Sample(serverTime.Val(), sent)
		now := serverTime.Val().UnixMilli()
		hashes := make([]*hash, len(keys))
		for i, read := range reads {
			hashes[i] = &hash{key: keys[i]}
			hashes[i].parse(s.Layout, now, maps.All(read.Val()), len(read.Val()))
		}
		return now, hashes, nil
	}
	return 0, nil, errStaleGeneration
}

func (s windowsStore) Peek(ctx context.Context, where Site, client string, _ int) (limits.View, error) {
	now, hashes, err := s.read(ctx, where.Node, where, client)
	if err != nil {
		return limits.View{}, err
	}
	v := limits.View{Now: now, Counts: make([]limits.Count, len(s.Rules))}
	for r, rule := range s.Rules {
		v.Counts[r] = hashes[s.hashOf(rule)].count(s.Layout, r, rule, now, now, 0)
	}
	return v, nil
}

// ErrNoClientShare: see Bucket.Flush.
var ErrNoClientShare = fmt.Errorf("leakybucket: %w: Windows keeps no per-client counts when every rule is per-resource, so Flush cannot tell a client's share: use FlushAll", errors.ErrUnsupported)

// Flush takes the client's hash away, in one transaction that reads what
// it held and deletes it, and then takes that share out of the resource's
// hash, in a second one run exactly once (it is marked, as a take-back
// is). It never fails because the client is busy: no WATCH. A decision of
// the client is in the hash when it is taken, and then taken out of the
// resource's too, or comes after and makes a new hash; a take-back of
// weight that the hash held when it was taken does nothing (see txn.Guard).
// Between the two transactions the resource counts the share still, which
// errs on the side of denying.
func (s windowsStore) Flush(ctx context.Context, where Site, client string) error {
	if !s.HasClientRule {
		return ErrNoClientShare
	}
	for range staleRetries {
		gen := s.gen(where.Keys)
		keys := s.hashes(where.Keys, gen, client)
		take := txn.New(where.Keys, false)
		read := take.Add("hgetall", keys[len(keys)-1])
		take.Add("del", keys[len(keys)-1])
		seen, timeAt := take.Add("get", where.Keys.Generation()), take.Add("time")
		if _, err := take.Exec(ctx, where.Node); err != nil {
			return err
		}
		if !s.saw(where.Keys, gen, take.Replies[seen]) {
			continue // a FlushAll came first: the client's hash is another one
		}
		server, _ := txn.ReplyTime(take.Replies[timeAt])
		mine := &hash{key: keys[len(keys)-1]}
		mine.parse(s.Layout, server.UnixMilli(), txn.ReplyFields(take.Replies[read]), txn.ReplyLen(take.Replies[read]))
		if !s.ClientScoped {
			takeBack(where, s.share(where.Keys, keys[0], mine, server.UnixMilli()), false)
		}
		return nil
	}
	return errStaleGeneration
}

// share is the marked transaction that takes mine's live intervals out of
// the resource's hash: of each span's, as the span's first lane holds them.
func (s windowsStore) share(ks keys.Space, resource string, mine *hash, now int64) *txn.Txn {
	t := txn.New(ks, true)
	for g, span := range s.Spans {
		current := limits.Entry{ID: s.FieldName(g, now/span), Weight: mine.current[g]}
		for _, e := range append(mine.lanes[s.LanesOf[g][0]], current) {
			if e.Weight > 0 {
				t.Add("hincrby", resource, e.ID, -e.Weight)
			}
		}
	}
	if len(t.Cmds) > 0 {
		t.Add(txn.DropIfMade(resource)...)
	}
	return t
}

// FlushAll starts a new generation, and deletes the hashes of the resource
// (with SCAN when a rule is per-client): a decision or take-back that
// raced it writes to the old generation, which nothing reads. When the
// generation's key expires, the names start again from the first
// generation's, so it must outlive every hash that holds an interval some
// rule counts: those written before the flush (Layout.GenLife after it: each
// was written by a call stamped before it) and those of its own generation
// (each decision extends it to its hash's deadline, with GT). It lives no
// longer than that.
func (s windowsStore) FlushAll(ctx context.Context, where Site) error {
	ks := []string{where.Keys.Hash(s.gen(where.Keys))}
	if s.HasClientRule {
		r := newKeyScan(where.Keys.Hashes(), s.ScanCount)
		if err := r.finish(ctx, where.Node); err != nil {
			return err
		}
		ks = r.found
	}
	var bumped *redis.IntCmd
	_, err := where.Node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		bumped = pipe.Incr(ctx, where.Keys.Generation())
		life := s.GenLife().Milliseconds()
		pipe.Do(ctx, "pexpire", where.Keys.Generation(), life, "nx")
		pipe.Do(ctx, "pexpire", where.Keys.Generation(), life, "gt")
		if len(ks) > 0 {
			pipe.Del(ctx, ks...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.gens.Store(where.Keys.Slot(), strconv.FormatInt(bumped.Val(), 10))
	return where.Route.owns(ctx, where.Node, where.Keys)
}

// Tag is the layout's: see intervals.Layout.Tag.
func (s windowsStore) Counting() Counting { return Counting{Layout: &s.Layout} }

func (s windowsStore) tag() string { return s.Layout.Tag() }
