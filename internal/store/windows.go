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
	return windowsStore{Plan: p, Layout: intervals.New(precision, p.Rules), gens: &sync.Map{}, tidy: &untidy{}}
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
// the client's hash (see guard) where there is one: until it lands,
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
	tidy *untidy   // the hashes to read whole next, for their dead fields
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
	// coarse: the hashes are read by their blocks (HMGET), not whole:
	// every call is far from its limits, as foresight saw them.
	coarse bool
}

// hash is one hash of a batch: its weight in the batch, where its read is
// among the replies, then its intervals.
type hash struct {
	key    string
	client bool // a client's hash, not the resource's
	added  int  // the batch's weight written to it
	read   int

	incarnation string           // a client's hash's, as read: see guard
	lanes       [][]limits.Entry // by lane: the intervals other than the current ones, stamped for it, oldest first
	current     []int            // by span: the current interval's weight before the batch
	admitted    int              // the batch's weight admitted so far
	denied      int              // the batch's weight to take back
	dead        []string         // fields no window counts any more
	blocks      [][]blockSum     // by span: the live blocks read (see intervals.Layout.Block)
	size        int              // where HLEN's reply is, when read coarse
	named       int              // how many fields the coarse read named

	// Room for lanes and current in the usual case, one lane, so that
	// reading a hash allocates no more than the intervals it holds.
	laneRoom    [1][]limits.Entry
	currentRoom [1]int
}

// coarseRequests is the fewest Requests of every rule for a Bucket's
// hashes to be read coarse: a hash holds at most about its rules'
// Requests of live intervals (only admitted weight stays), and one of
// fewer fields costs little more to read whole than its blocks.
const coarseRequests = 128

// manyCalls reports whether every rule admits at least coarseRequests.
func (s windowsStore) manyCalls() bool {
	for _, r := range s.Rules {
		if r.Requests < coarseRequests {
			return false
		}
	}
	return true
}

// blockSum is one block's field as read: its block and weight.
type blockSum struct {
	k int64
	w int
}

func (s windowsStore) newBatch(ks keys.Space, now int64, calls []limits.Call) *hBatch {
	b := &hBatch{windowsStore: s, keys: ks, gen: s.gen(ks), now: now, calls: calls, byKey: map[string]*hash{},
		ofCalls: make([]*hash, 0, 2*len(calls)),
		token:   strconv.FormatUint(rand.Uint64(), 36),
		coarse:  s.Coarse && !s.RecordDenied && s.manyCalls()}
	for _, c := range calls {
		b.coarse = b.coarse && !c.Near && !c.Look
		hashKeys := s.hashes(ks, b.gen, c.Client)
		for i, key := range hashKeys {
			h := b.hashNamed(key, s.HasClientRule && i == len(hashKeys)-1)
			if !c.Look {
				h.added += c.N
			}
			b.ofCalls = append(b.ofCalls, h)
		}
	}
	return b
}

// hashNamed returns the batch's hash of key, made if need be; a hash
// to be read whole for its dead fields makes the batch read whole.
func (b *hBatch) hashNamed(key string, client bool) *hash {
	h := b.byKey[key]
	if h == nil {
		h = &hash{key: key, client: client}
		b.byKey[key] = h
		b.order = append(b.order, h)
		b.coarse = b.coarse && !b.tidy.has(key)
	}
	return h
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
			b.queueWrite(t, h, key)
		}
		if b.coarse {
			read := b.coarseRead(h)
			h.read, h.size, h.named = t.Add(read...), t.Add("hlen", key), len(read)-2
		} else {
			h.read = t.Add("hgetall", key)
		}
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

// queueWrite queues the batch's weight into h: into the current interval
// of each span, and its block.
func (b *hBatch) queueWrite(t *txn.Txn, h *hash, key any) {
	if h.client {
		t.Add("hsetnx", key, txn.IncarnationField, b.token)
	}
	for g, span := range b.Spans {
		t.Add("hincrby", key, b.Current(g, b.now), h.added)
		if b.Blocks[g] > 0 {
			t.Add("hincrby", key, b.BlockName(g, b.Block(g, b.now/span)), h.added)
		}
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
// take-back of the calls not recorded, the move of those recorded to the
// interval Redis ran them in (see moves), and the deletion of dead fields
// the transaction did not delete.
func (b *hBatch) judge(t *txn.Txn, judge Judge, back *txn.Txn, now int64) error {
	if !b.saw(b.keys, b.gen, t.Replies[b.genReply]) {
		return errStaleGeneration
	}
	if b.crossedMixed(now) {
		b.takeAll(t, back)
		return errCrossed
	}
	undecided := !b.read(t, now)
	for i, c := range b.calls {
		hashes := b.hashesOf(i)
		v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
		for r, rule := range b.Rules {
			h := hashes[b.hashOf(rule)]
			v.Counts[r] = b.countOf(h, r, rule, now)
			undecided = undecided || b.coarse && !rule.HasRoom(v.Counts[r].Used, limits.AddCapped(c.N, rule.Margin()))
		}
		// A call after one left undecided is too: it must not take the
		// room of the one before it.
		v.Undecided = undecided
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
	b.queueMoves(back, now)
	b.queueBack(back, func(h *hash) int { return h.denied })
	return nil
}

// read reads the hashes from t's replies, without the batch's weight,
// and reports whether what it read can decide the calls (see readCoarse).
func (b *hBatch) read(t *txn.Txn, now int64) bool {
	covered := true
	for _, h := range b.order {
		if b.coarse {
			covered = b.readCoarse(h, t, now) && covered
		} else {
			h.parseAt(b.Layout, func(g int) int64 { return b.at(g, now) }, txn.ReplyFields(t.Replies[h.read]), txn.ReplyLen(t.Replies[h.read]))
			b.tidy.done(h.key)
		}
		b.unbatch(h, now)
	}
	return covered
}

// errCrossed: Redis ran the transaction in a later interval than its
// stamp's, in a span that has both a fixed lane (judged at the stamp) and
// a sliding one (which must count a call no earlier than Redis ran it):
// no one interval serves both, so the decision is made again.
var errCrossed = fmt.Errorf("%w: Redis ran it in a later interval than its stamp's", errRedo)

// crossedMixed reports whether Redis's time now is in a later interval
// than the stamp's in a span with both a fixed and a sliding lane.
func (b *hBatch) crossedMixed(now int64) bool {
	for g, span := range b.Spans {
		if fixed, sliding := b.Kinds(g); fixed && sliding && now/span != b.now/span {
			return true
		}
	}
	return false
}

// at is when span group g's calls of the batch count as made: at the
// stamp, which chose the interval they were written to, unless they are
// moved to the interval Redis ran the transaction in (see moves).
func (b *hBatch) at(g int, now int64) int64 {
	if b.moves(g, now) {
		return now
	}
	return b.now
}

// moves reports whether span group g's calls of the batch, written to
// the stamp's interval, are moved to the one Redis ran the transaction in
// (now), so that none counts as made before Redis ran it, and leaves a
// window early, however long this process stalled between stamping and
// sending: when that interval is a later one, and the stamp's ended more
// than maxEarly before (as SortedSet scores again), in a span of sliding
// lanes only. A fixed lane's calls are judged with the window the stamp
// chose (see count), and a span with both kinds is made again
// (crossedMixed).
func (b *hBatch) moves(g int, now int64) bool {
	span := b.Spans[g]
	fixed, _ := b.Kinds(g)
	return !fixed && now/span != b.now/span && now-b.Lanes[b.LanesOf[g][0]].At(b.now/span) > maxEarly
}

// unbatch takes the batch's weight out of what was read of h: of the
// interval it was written to, the stamp's, and of its block.
func (b *hBatch) unbatch(h *hash, now int64) {
	for g, span := range b.Spans {
		written := b.now / span
		if b.Blocks[g] > 0 {
			k := b.Block(g, written)
			for i := range h.blocks[g] {
				if h.blocks[g][i].k == k {
					h.blocks[g][i].w -= h.added
				}
			}
		}
		switch {
		case b.coarse:
		case b.at(g, now)/span == written:
			h.current[g] -= h.added
		default: // Redis ran it in a later interval: the written one is a past one now
			for _, l := range b.LanesOf[g] {
				h.lanes[l] = withWeight(h.lanes[l], b.Lanes[l].At(written), -h.added)
			}
		}
	}
}

// withWeight adds n to the entry stamped at among entries, oldest first,
// and drops it if it holds no weight then.
func withWeight(entries []limits.Entry, at int64, n int) []limits.Entry {
	i, found := slices.BinarySearchFunc(entries, at, func(e limits.Entry, t int64) int { return cmp.Compare(e.At, t) })
	if !found {
		return entries
	}
	if entries[i].Weight += n; entries[i].Weight <= 0 {
		return slices.Delete(entries, i, i+1)
	}
	return entries
}

// countOf is what rule r counts in h for the batch's next call: exactly,
// or at most if h was read coarse; with the weight the batch admitted in
// h so far.
func (b *hBatch) countOf(h *hash, r int, rule limits.Rule, now int64) limits.Count {
	at := b.at(b.Lane(r).Group, now)
	if b.coarse {
		return h.bound(b.Layout, r, rule, at, now, h.admitted)
	}
	c := h.count(b.Layout, r, rule, at, now, h.admitted)
	c.Bound = c.Used
	if b.Coarse {
		c.Bound = h.bound(b.Layout, r, rule, at, now, h.admitted).Used
	}
	return c
}

// queueMoves queues on back, for each hash, the move of the weight the
// batch recorded from the interval it was written to, the stamp's, to the
// one Redis ran the transaction in, where it was judged (see at), if they
// differ: so that no call counts as made before Redis ran it. Until the
// move lands, others count the calls in the earlier interval, a round
// trip, long before it leaves any window. The written interval's block
// keeps the weight (blocks only grow: see bound). A hash gone meanwhile
// (a FlushAll deleted it) is not made again; the deadline only moves
// later, to cover the new interval.
func (b *hBatch) queueMoves(back *txn.Txn, now int64) {
	for _, h := range b.order {
		moved := false
		for g, span := range b.Spans {
			from, to := b.now/span, now/span
			if h.admitted <= 0 || !b.moves(g, now) {
				continue
			}
			moved = true
			back.Add("hincrby", h.key, b.FieldName(g, from), -h.admitted)
			back.Add("hincrby", h.key, b.FieldName(g, to), h.admitted)
			if b.Blocks[g] > 0 && b.Block(g, to) != b.Block(g, from) {
				back.Add("hincrby", h.key, b.BlockName(g, b.Block(g, to)), h.admitted)
			}
		}
		if moved {
			back.Add(txn.DropIfMade(h.key)...)
			back.Add("pexpireat", h.key, b.ExpireAt(now), "gt")
		}
	}
}

// coarseRead is the read of h's blocks: HMGET of the incarnation (of a
// client's hash), and of each span's blocks from the one the oldest live
// interval is in to the one after the current interval's (another
// process's estimate may be ahead).
func (b *hBatch) coarseRead(h *hash) []any {
	cmd := []any{"hmget", h.key}
	if h.client {
		cmd = append(cmd, txn.IncarnationField)
	}
	for g := range b.Spans {
		first, last := b.blockRange(g)
		for k := first; k <= last; k++ {
			cmd = append(cmd, b.BlockName(g, k))
		}
	}
	return cmd
}

// blockRange is the blocks of span group g a coarse read names.
func (b *hBatch) blockRange(g int) (first, last int64) {
	bounds := b.Bounds(g, b.now)
	return b.Block(g, bounds.Dead+1), b.Block(g, bounds.Current) + 1
}

// readCoarse reads h's blocks from t's replies, and reports whether they
// cover every interval that may hold weight: up to Redis's time now (every
// interval written before holds calls stamped, or moved, no later). If h
// holds many more fields than its live blocks can account for, it is read
// whole next time, to find its dead fields (tidyAt).
func (b *hBatch) readCoarse(h *hash, t *txn.Txn, now int64) bool {
	values, _ := t.Replies[h.read].([]any)
	h.clearBlocks(len(b.Spans))
	if len(values) != h.named {
		return false // not the reply of the fields named: nothing to decide on
	}
	if h.client {
		h.incarnation, values = replyValue(values[0]), values[1:]
	}
	covered, fields := true, 1
	for g := range b.Spans {
		first, last := b.blockRange(g)
		for k := first; k <= last; k++ {
			w, err := strconv.Atoi(replyValue(values[0]))
			values = values[1:]
			if err == nil {
				h.blocks[g] = append(h.blocks[g], blockSum{k: k, w: w})
				fields += 1 + int(min(int64(max(w, 0)), b.Blocks[g]))
			}
		}
		covered = covered && b.Block(g, now/b.Spans[g]) <= last
	}
	if int(txn.ReplyInt(t.Replies[h.size])) > fields+tidyAt {
		b.tidy.add(h.key)
	}
	return covered
}

// replyValue reads one value of an HMGET reply: "" for a field the hash
// does not hold.
func replyValue(v any) string {
	if v == nil {
		return ""
	}
	return txn.ReplyString(v)
}

// bound is at most what rule r counts in h at now, from its blocks alone,
// for a call made at at with extra weight on top of what h held: every
// block the window reaches, counted whole, and until its last interval
// leaves. A block holds every weight ever written to its intervals (a
// decision adds to both, and nothing takes weight out of a block), so it
// is at least what they hold now. The newest interval counted is at most
// the call's own, at (Redis's time): no call is counted later than Redis
// ran its transaction, a stamp being no later than that and a move going
// no further (see queueMoves); so ResetAfter is exact for a call the
// bound admits.
func (h *hash) bound(y intervals.Layout, r int, rule limits.Rule, at, now int64, extra int) limits.Count {
	l := y.Lane(r)
	c := limits.Count{Stamp: l.Stamp(at), Used: extra}
	for _, b := range h.blocks[l.Group] {
		if b.w > 0 && l.At(y.BlockLast(l.Group, b.k))+rule.Window > now {
			c.Used = limits.AddCapped(c.Used, b.w)
		}
	}
	if c.Used > 0 {
		c.Newest = c.Stamp
	}
	c.Bound = c.Used
	return c
}

func (b *hBatch) idempotent() bool { return false }

// takeAll queues the take-back of the batch's whole weight. Where t's
// replies are known, the clients' hashes are known by their incarnation
// as read; else only if the batch made them (see guard).
func (b *hBatch) takeAll(t, back *txn.Txn) {
	for _, h := range b.order {
		switch {
		case t.Replies == nil:
		case b.coarse:
			if values, _ := t.Replies[h.read].([]any); h.client && len(values) > 0 {
				h.incarnation = replyValue(values[0])
			}
		default:
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
// of it and of the resource's under a guard (see guard): not after a Flush
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
// intervals, its blocks, and the fields no window counts any more. Fields
// that are neither are not ours.
func (h *hash) parse(y intervals.Layout, now int64, fields iter.Seq2[string, string], size int) {
	h.parseAt(y, func(int) int64 { return now }, fields, size)
}

// parseAt is parse with each span group g read at at(g): a decision's
// batch reads a span at the time its calls count as made (hBatch.at).
// Blocks are dead once their last interval is, at the first span's time.
func (h *hash) parseAt(y intervals.Layout, at func(g int) int64, fields iter.Seq2[string, string], size int) {
	h.clear(y, size)
	h.clearBlocks(len(y.Spans))
	now := at(0)
	first := y.Bounds(0, now)
	for field, value := range fields {
		g, index, ok := y.Interval(field)
		if !ok {
			// Not parsed: the incarnation's value is no number, and a
			// failed parse allocates its error.
			h.other(y, field, value, now)
			continue
		}
		n, err := strconv.Atoi(value)
		live := first // the usual case, found once
		if g != 0 {
			live = y.Bounds(g, at(g))
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

// other reads a field that is not an interval: the incarnation, a block
// (dead once its last interval is, at now), or not ours.
func (h *hash) other(y intervals.Layout, field, value string, now int64) {
	if field == txn.IncarnationField {
		h.incarnation = value
		return
	}
	g, k, ok := y.ParseBlock(field)
	if !ok {
		return
	}
	if y.BlockLast(g, k) <= y.Bounds(g, now).Dead {
		h.dead = append(h.dead, field)
	} else if w, err := strconv.Atoi(value); err == nil {
		h.blocks[g] = append(h.blocks[g], blockSum{k: k, w: w})
	}
}

// clearBlocks empties h's blocks, for spans spans.
func (h *hash) clearBlocks(spans int) {
	if len(h.blocks) != spans {
		h.blocks = make([][]blockSum, spans)
	}
	for g := range h.blocks {
		h.blocks[g] = h.blocks[g][:0]
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
// weight that the hash held when it was taken does nothing (see guard).
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
// rule counts: those written before the flush (genLife after it: each
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

// tag is the layout's: see layout.tag.
func (s windowsStore) Counting() Counting { return Counting{Layout: &s.Layout} }

func (s windowsStore) tag() string { return s.Layout.Tag() }

// untidy is the hashes a coarse read found holding more fields than their
// live blocks account for: dead intervals, which only a whole read names,
// and deletes (tidyAt). The next batch that touches one reads it whole.
type untidy struct {
	mu     sync.Mutex
	hashes map[string]struct{}
}

// maxUntidy bounds the hashes kept: past it they are forgotten, and a
// hash still untidy is found again by its next coarse read.
const maxUntidy = 1 << 14

func (u *untidy) add(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.hashes == nil || len(u.hashes) >= maxUntidy {
		u.hashes = map[string]struct{}{}
	}
	u.hashes[key] = struct{}{}
}

func (u *untidy) has(key string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.hashes[key]
	return ok
}

func (u *untidy) done(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.hashes, key)
}
