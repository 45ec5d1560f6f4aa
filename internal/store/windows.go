package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// NewWindows returns the store of Windows(precision) for p: of
// FixedWindows if precision is 0.
func NewWindows(p Plan, precision time.Duration) Store {
	return windowsStore{Plan: p, lockFree: lockFree{clientScoped: p.ClientScoped}, Layout: intervals.New(precision, p.Rules), gens: &sync.Map{}}
}

// windowsStore is the Windows strategy: precision-bucket sliding windows,
// and fixed ones, decided in one fenced MULTI/EXEC without a lock
// (round.go). A scope (the resource when a rule is per-resource, each
// client when a rule is per-client) keeps, per span of the rules'
// intervals (package intervals), a hash per epoch: the weight added in
// each of its intervals, and their total (field t). A rule counts the
// intervals of its span whose stamp is inside its window: of the current
// epoch and the one before, never more (an epoch is the longest window).
//
// Per batch, the transaction reads the resource's generation (GET, see
// below), and for each hash of the current epoch it writes to adds the
// batch's weight to the current interval and to the total (HINCRBY),
// whose reply is the epoch's total with it. A batch whose calls on a
// scope were all sent Far (package foresight: far from every limit, as
// this process last saw them) reads no more than the totals of the
// epochs before and after (HGET): their sum bounds what any window
// counts, and a call it leaves a margin beside is admitted on it, as the
// intervals would admit it (limits.Count.Bounded); the others are read
// whole (HGETALL of each epoch). An epoch's hash expires, whole, once
// none of its intervals is in any window: nothing deletes an interval on
// its own.
//
// The calls are then evaluated in order: each counts what was read, less
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

// scopes returns what the names of the hashes a call by client writes
// and reads start with, in generation gen: the resource's first.
func (s windowsStore) scopes(ks keys.Space, gen, client string) []string {
	var out []string
	if !s.ClientScoped {
		out = append(out, ks.Hash(gen))
	}
	if s.HasClientRule {
		out = append(out, ks.ClientHash(gen, client))
	}
	return out
}

// scopesPerCall is how many scopes returns.
func (s windowsStore) scopesPerCall() int {
	n := 0
	if !s.ClientScoped {
		n++
	}
	if s.HasClientRule {
		n++
	}
	return n
}

// hashOf is the index, among a call's scopes, of the one rule counts in.
func (s windowsStore) hashOf(rule limits.Rule) int {
	if rule.PerClient && !s.ClientScoped {
		return 1
	}
	return 0
}

// errStaleGeneration: a decision wrote to the hashes of a generation that
// a FlushAll had ended, which nothing reads: it is made again.
var errStaleGeneration = fmt.Errorf("%w: the counts were flushed meanwhile", errRedo)

// Decide decides calls in a round of their hashes (hBatch), made again
// after a FlushAll as often as it takes (decideRound), then the calls the
// round left undecided (confirm).
func (s windowsStore) Decide(ctx context.Context, where Site, calls []limits.Call, evaluate Evaluate) error {
	var b *hBatch
	err := decideRound(ctx, where, func(now int64) round { b = s.newBatch(where.Keys, now, calls); return b }, evaluate)
	if err == nil && len(b.pending) > 0 {
		b.confirm(ctx, where, evaluate)
	}
	return err
}

// hBatch is the round of one batch on the hashes of a resource.
type hBatch struct {
	windowsStore
	keys     keys.Space
	gen      string
	now      int64
	calls    []limits.Call
	ran      int64         // Redis's time when its transaction ran, ms
	settled  bool          // its weight was moved to the interval of ran (see early)
	pending  []pendingCall // left undecided by a bound: see confirm
	byScope  map[string]*hash
	order    []*hash
	hashes   []hash  // the batch's hashes, made in one array (order points into it)
	ofCalls  []*hash // each call's hashes, as scopes orders them: found once, not by name per call
	genReply int
	token    string // the incarnation of the clients' hashes it makes
	// By span group, boxed once for every hash's commands: the field of
	// the stamp's interval, and its epoch's deadline.
	current, deadlines []any
}

func (s windowsStore) newBatch(ks keys.Space, now int64, calls []limits.Call) *hBatch {
	most := len(calls) * s.scopesPerCall()
	b := &hBatch{windowsStore: s, keys: ks, gen: s.gen(ks), now: now, calls: calls, byScope: make(map[string]*hash, most),
		ofCalls: make([]*hash, 0, most), hashes: make([]hash, 0, most), order: make([]*hash, 0, most),
		token: strconv.FormatUint(rand.Uint64(), 36)}
	for g := range s.Spans {
		b.current = append(b.current, s.Current(g, now))
		b.deadlines = append(b.deadlines, s.EpochExpireAt(g, s.Epoch(g, now)))
	}
	for _, c := range calls {
		scopes := s.scopes(ks, b.gen, c.Client)
		for i, scope := range scopes {
			h := b.byScope[scope]
			if h == nil {
				h = b.newHash(scope, s.HasClientRule && i == len(scopes)-1)
				b.byScope[scope] = h
				b.order = append(b.order, h)
			}
			if !c.Look {
				h.added += c.N
			}
			// A call that may be denied needs the intervals, for
			// RetryAfter; one that looks writes no total to read.
			h.whole = h.whole || !c.Far || c.Look || s.RecordDenied
			b.ofCalls = append(b.ofCalls, h)
		}
	}
	return b
}

// hashesOf returns call i's hashes, as scopes orders them.
func (b *hBatch) hashesOf(i int) []*hash {
	n := len(b.ofCalls) / len(b.calls)
	return b.ofCalls[i*n : (i+1)*n]
}

// totalField is the field of an epoch's hash that holds the total of its
// intervals: every write adds to both, and a take-back takes from both, but
// takes from the total only the first time it is sent (txn.Resent). So the
// total is what the intervals hold, as a read counts them (with the
// hash's pending fields: see txn.Txn.Resend), or more when a take-back
// sent again did not run the first time. Written first after the
// incarnation, it sits at the front of a small hash, where HGET and
// HINCRBY find it at once.
const totalField = txn.TotalField

// nearEnd is how close to the end of an epoch a stamp must be for its
// batch to read the next epoch too: Redis may run the transaction in it
// (up to clock.Jump and a round trip after the stamp, see stampOff), and
// a window there reaches into the stamp's epoch and the next.
const nearEnd = 2 * clock.Jump

// reach is how many epochs after the stamp's a batch reads, in span
// group g: the next one too where the stamp is near the end of its own.
func (b *hBatch) reach(g int) int64 {
	if epoch := b.Epochs[g]; b.now%epoch >= epoch-nearEnd.Milliseconds() {
		return 1
	}
	return 0
}

// queue adds the batch's commands, each hash's key boxed once for them.
func (b *hBatch) queue(t *txn.Txn) {
	// At most 4 writes and 3 reads of each hash and span group, of about
	// 25 arguments in all.
	n := len(b.order) * len(b.Spans)
	t.Grow(2+7*n, 6+25*n)
	b.genReply = t.Add("get", b.keys.Generation())
	var latest int64 // the latest deadline the batch gives a hash
	for _, h := range b.order {
		for g := range h.parts {
			p := &h.parts[g]
			if h.added > 0 {
				b.queueWrite(t, h, g)
				latest = max(latest, b.EpochExpireAt(g, p.epoch))
			}
			b.queueReads(t, h, g)
		}
	}
	if latest > 0 && b.gen != "" {
		// The generation outlives every hash of its own (see flushAll).
		t.Add("pexpireat", b.keys.Generation(), latest, "gt")
	}
}

// queueWrite adds the batch's weight to h's current interval of span group
// g, and to its epoch's total; a client's hash it makes gets the batch's
// incarnation first. The deadline is the epoch's, the same for every
// writer (EpochExpireAt): it never shortens a hash's life.
func (b *hBatch) queueWrite(t *txn.Txn, h *hash, g int) {
	p := &h.parts[g]
	key, added := p.args[1], any(h.added) // boxed once for their commands
	if h.client {
		t.Add("hsetnx", key, intervals.IncarnationField, b.token)
	}
	if b.sliding(g) {
		p.total = t.Add("hincrby", key, totalField, added)
	}
	p.interval = t.Add("hincrby", key, b.current[g], added)
	t.Add("pexpireat", key, b.deadlines[g])
}

// sliding reports whether span group g has a sliding lane, which counts
// the intervals of more than one epoch: its hashes keep a total. A fixed
// lane counts only the current interval, which the write's reply holds.
func (b windowsStore) sliding(g int) bool {
	_, sliding := b.Kinds(g)
	return sliding
}

// queueReads adds the reads of h's epochs of span group g: whole, or, for
// a hash read far, the totals of the epochs beside the stamp's and the
// incarnation of a client's it writes to.
func (b *hBatch) queueReads(t *txn.Txn, h *hash, g int) {
	p := &h.parts[g]
	if !b.sliding(g) {
		// The reply of the write holds its interval's weight: a hash
		// that only looks is read, and a client's incarnation.
		if h.added == 0 {
			p.read(t, 1, readWhole)
		} else if h.client {
			p.read(t, 1, readIncarnation)
		}
		return
	}
	for i := range 2 + int(b.reach(g)) {
		switch {
		case h.whole:
			p.read(t, i, readWhole)
		case i != 1:
			p.read(t, i, readTotal)
		case h.client:
			p.read(t, i, readIncarnation)
		}
	}
}

// read queues the read of p's i-th epoch.
func (p *part) read(t *txn.Txn, i int, kind readKind) {
	p.kinds[i] = kind
	switch kind {
	case readWhole:
		p.reads[i] = t.Add("hgetall", p.args[i])
	case readTotal:
		p.reads[i] = t.Add("hget", p.args[i], totalField)
	case readIncarnation:
		p.reads[i] = t.Add("hget", p.args[i], intervals.IncarnationField)
	}
}

// conclude asks evaluate about each call in order, but those what was read
// leaves undecided (limits.View.Undecided), left pending for confirm, and
// queues on back the take-back of the calls not recorded, from where
// their weight lies (see home).
func (b *hBatch) conclude(t *txn.Txn, evaluate Evaluate, back *txn.Txn, now int64) error {
	if !b.saw(b.keys, b.gen, t.Replies[b.genReply]) {
		return errStaleGeneration
	}
	if err := b.unread(now); err != nil {
		b.takeAll(t, back)
		return err
	}
	b.ran = now
	for _, h := range b.order {
		b.read(h, t.Replies, now)
	}
	for i := range b.calls {
		b.evaluateCall(i, evaluate, now)
	}
	b.queueBack(back, func(h *hash) int { return h.denied })
	return nil
}

// evaluateCall asks evaluate about call i, on the batch's counts with the calls
// evaluated before it, unless they leave it undecided: then it is left
// pending, decided after the others (confirm).
func (b *hBatch) evaluateCall(i int, evaluate Evaluate, now int64) {
	c, hashes := b.calls[i], b.hashesOf(i)
	v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
	for r, rule := range b.Rules {
		v.Counts[r] = b.count(hashes[b.hashOf(rule)], r, rule, b.at(b.Lane(r).Group, now), now)
	}
	if !c.Look && v.Undecided(b.Rules, c.N) {
		b.pending = append(b.pending, pendingCall{i: i, view: v})
		for _, h := range hashes {
			h.pending += c.N
		}
		return
	}
	kept := keptOf(c, b.Rules, v, evaluate(i, v))
	for _, h := range hashes {
		if !c.Look { // else it wrote nothing
			h.admitted += kept
			h.denied += c.N - kept
		}
	}
}

// keptOf is how much of the weight N that call c wrote stays counted,
// given v, what its rules counted before it, and whether evaluate said to
// record it: its Weight (all of N but for a call AtMost), or none. The rest
// is taken back, as a denied call's whole weight is.
func keptOf(c limits.Call, rules []limits.Rule, v limits.View, recorded bool) int {
	if !recorded {
		return 0
	}
	return c.Weight(rules, v.Counts)
}

// errCrossed: Redis ran the transaction in a later interval than its
// stamp's (see late), in a span that is a fixed window: its calls,
// evaluated with the window of the stamp, would count in a window that
// ended before Redis ran them, and cannot be moved to the next, whose room
// they were not evaluated by. So the decision is taken back and made
// again, stamped in the next window.
var errCrossed = fmt.Errorf("%w: Redis ran it in a later window than its stamp's", errRedo)

// errUnread: Redis ran the transaction in an epoch whose windows reach
// one the batch did not read (the stamp was far from the end of its
// epoch, and Redis ran it in the next: a long stall, or a clock that
// jumped): it is taken back and made again.
var errUnread = fmt.Errorf("%w: Redis ran it in an epoch it did not read", errRedo)

// unread says why a transaction Redis ran at now must be made again, if
// it must: a fixed window it crossed (errCrossed), or an epoch it did not
// read (errUnread).
func (b *hBatch) unread(now int64) error {
	for g := range b.Spans {
		fixed, sliding := b.Kinds(g)
		if fixed && b.late(g, now) {
			return errCrossed
		}
		e := b.Epoch(g, b.now)
		if at := b.Epoch(g, now); sliding && (at < e || at > e+b.reach(g)) {
			return errUnread
		}
	}
	return nil
}

// late reports whether Redis ran the transaction (at now) in a later
// interval of span group g than the batch's stamp's. A sliding interval
// counts its calls as made at its last millisecond, so that such a call,
// left there, would count as made before the millisecond Redis ran it in,
// and leave its windows as early (a process that stalled between stamping
// and sending: even a millisecond early, a window of Per(1, time.Second)
// admitted twice within 999 ms of Redis's clock).
func (b *hBatch) late(g int, now int64) bool {
	span := b.Spans[g]
	return now/span > b.now/span
}

// moves reports whether the batch's calls of span group g, written to the
// stamp's interval, count in the one Redis ran the transaction in (now),
// and are moved there (early) before they are evaluated: when it is
// late, in a span of sliding lanes only (see errCrossed for the others).
func (b *hBatch) moves(g int, now int64) bool {
	fixed, _ := b.Kinds(g)
	return !fixed && b.late(g, now)
}

// at is when span group g's calls of the batch count as made: at now if
// they are moved, else at the stamp.
func (b *hBatch) at(g int, now int64) int64 {
	if b.moves(g, now) {
		return now
	}
	return b.now
}

// early returns, if Redis ran the batch's transaction at now in a later
// interval than its stamp's, in a span of sliding lanes, the transaction
// that moves the weight the batch wrote to the stamp's interval to now's
// (see moves): nil if it moves none, or if the batch is to be made again
// (unread). replies are the batch's transaction's. A sliding interval
// counts its calls as made at its last millisecond: left in the stamp's,
// they would count as made before Redis ran them, and leave their windows
// as early. It is marked, as a move must run once, and it runs before the
// calls are evaluated (see settleEarly), so that a call's Result and every
// count made after it count it where it was made. Until it runs, others
// count the weight in the earlier interval, which is in every window the
// later one is in; a move never lowers what any window counts from then
// on. A hash it would make of the earlier epoch is not kept; one of the
// later epoch is, with its epoch's deadline, which the generation's then
// covers.
//
// A client's weight is moved, in its hash and in the resource's, under a
// guard of the client's hash (see moveGuard): a Flush that took the hash
// meanwhile took that weight out of the resource's where the hash held it,
// at the stamp's interval, and a move after it would take it out there a
// second time and add it to now's, where every read would count it again
// (a read counts an interval left below zero as none), but the totals,
// which a call sent Far is decided on, would not.
func (b *hBatch) early(replies []any, now int64) *txn.Txn {
	if b.unread(now) != nil {
		return nil
	}
	b.ran = now
	fix := txn.New(b.keys, true)
	resource := b.byScope[b.keys.Hash(b.gen)]
	var latest int64
	for _, h := range b.order {
		for g := range h.parts {
			if h.added == 0 || !b.moves(g, now) {
				continue
			}
			switch {
			case h.client:
				fix.Guards = append(fix.Guards, b.moveGuard(h, resource, g, now, replies))
			case !b.HasClientRule: // no Flush takes a client's share
				fix.Cmds = b.move(fix.Cmds, h, g, now, h.added)
			}
			latest = max(latest, b.EpochExpireAt(g, b.Epoch(g, now)))
		}
	}
	if latest == 0 {
		return nil
	}
	if b.gen != "" {
		fix.Add("pexpireat", b.keys.Generation(), latest, "gt")
	}
	fix.Keep(latest)
	return fix
}

// moveGuard is the move of h's weight in span group g, h a client's hash,
// to the interval of now, and of as much of the resource's, if a rule is
// per-resource: under a guard of h's incarnation, as replies show it, or
// as the batch made it.
func (b *hBatch) moveGuard(h, resource *hash, g int, now int64, replies []any) txn.Guard {
	b.readIncarnations(h, replies)
	cmds := b.move(nil, h, g, now, h.added)
	if resource != nil {
		cmds = b.move(cmds, resource, g, now, h.added)
	}
	return b.guardOf(h, g, cmds)
}

// inTime reports whether the weight moved, by a transaction that ran at
// Redis time ran, was counted by every decision made meanwhile: one at
// Redis time r counts a sliding interval stamped at s in a window of w ms
// while s + w > r (limits.Rule.Counts), and ran bounds every r before it.
func (b *hBatch) inTime(ran int64) bool {
	for r, rule := range b.Rules {
		if l := b.Lane(r); b.moves(l.Group, b.ran) && l.Stamp(b.now)+rule.Window <= ran {
			return false
		}
	}
	return true
}

// landed says that the transaction early returned ran: the batch's
// weight lies where it moved it (see home).
func (b *hBatch) landed() { b.settled = true }

// move appends to cmds the move of w, of the batch's weight in h's span
// group g, to the interval of now, in the epoch of now's hash (read: see
// unread).
func (b *hBatch) move(cmds [][]any, h *hash, g int, now int64, w int) [][]any {
	p := &h.parts[g]
	from, to := p.keys[1], p.keys[1]
	cmds = append(cmds, []any{"hincrby", from, b.Current(g, b.now), -w})
	if e := b.Epoch(g, now); e != p.epoch {
		to = p.keys[1+e-p.epoch]
		cmds = append(cmds, []any{"hincrby", from, totalField, -w})
		if h.client {
			cmds = append(cmds, []any{"hsetnx", to, intervals.IncarnationField, b.token})
		}
		cmds = append(cmds, []any{"hincrby", to, totalField, w}, []any{"pexpireat", to, b.EpochExpireAt(g, e)})
	}
	cmds = append(cmds, []any{"hincrby", to, b.Current(g, now), w})
	return append(cmds, txn.DropIfMade(from))
}

// home is where the batch's weight in h's span group g lies: the key
// and field of the stamp's interval, and its epoch; or of the interval
// Redis ran the transaction in, once the weight was moved there (see
// early).
func (b *hBatch) home(h *hash, g int) (key string, field any, epoch int64) {
	p := &h.parts[g]
	if b.settled && b.moves(g, b.ran) {
		e := b.Epoch(g, b.ran)
		return p.keys[1+e-p.epoch], b.Current(g, b.ran), e
	}
	return p.keys[1], b.Current(g, b.now), p.epoch
}

func (b *hBatch) idempotent() bool { return false }

// takeAll queues the take-back of the batch's whole weight. Where t's
// replies are known, the clients' hashes are known by their incarnation
// as read; else only if the batch made them (see txn.Guard).
func (b *hBatch) takeAll(t, back *txn.Txn) {
	for _, h := range b.order {
		if t.Replies != nil {
			b.readIncarnations(h, t.Replies)
		}
	}
	b.queueBack(back, func(h *hash) int { return h.added })
}

// queueBack queues the take-back of weight(h) from each hash h. The
// weight a client's hash holds is taken out of it and of the resource's
// under a guard (see txn.Guard): not after a Flush took it out with the
// client's hash.
func (b *hBatch) queueBack(back *txn.Txn, weight func(*hash) int) {
	resource := b.byScope[b.keys.Hash(b.gen)]
	for _, h := range b.order {
		n := weight(h)
		switch {
		case n <= 0:
		case h.client:
			for g := range h.parts {
				cmds := b.subtract(nil, h, g, n)
				if resource != nil {
					cmds = b.subtract(cmds, resource, g, n)
				}
				back.Guards = append(back.Guards, b.guardOf(h, g, cmds))
				_, _, epoch := b.home(h, g)
				back.Keep(b.EpochExpireAt(g, epoch))
			}
		case !b.HasClientRule:
			for g := range h.parts {
				back.Cmds = b.subtract(back.Cmds, h, g, n)
				_, _, epoch := b.home(h, g)
				back.Keep(b.EpochExpireAt(g, epoch))
			}
		}
	}
}

// guardOf guards cmds, which change h, a client's hash, in span group g,
// and the resource's: they apply only while h is the hash the batch wrote
// to, of its incarnation as read, or as the batch made it.
func (b *hBatch) guardOf(h *hash, g int, cmds [][]any) txn.Guard {
	p := &h.parts[g]
	guard := txn.Guard{Key: p.keys[1], Field: intervals.IncarnationField, Want: []string{b.token}, Cmds: cmds}
	if p.incarnation != "" {
		guard.Want = append(guard.Want, p.incarnation)
	}
	return guard
}

// subtract appends to cmds the commands that take n out of the interval
// of span group g where h holds the batch's weight (see home), and its
// epoch's total (see totalField).
func (b *hBatch) subtract(cmds [][]any, h *hash, g, n int) [][]any {
	key, field, _ := b.home(h, g)
	if b.sliding(g) {
		cmds = append(cmds, []any{"hincrby", key, totalField, -n})
	}
	cmds = append(cmds, []any{"hincrby", key, field, -n})
	// A hash gone meanwhile (it expired, or a FlushAll deleted it) is not
	// made again.
	return append(cmds, txn.DropIfMade(key))
}

// Tag is the layout's, and "e": the intervals are kept in a hash per
// epoch, where a Bucket of this layout once kept them in one hash per
// scope, which a process of that version still reads and writes. The
// two never share a key, so that neither misreads the other's.
func (s windowsStore) Tag() string { return s.Layout.Tag() + "e" }
