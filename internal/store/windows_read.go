package store

import (
	"cmp"
	"iter"
	"math/bits"
	"slices"
	"strconv"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// What a Windows decision reads of a scope's hashes, and what each rule
// counts in them.

// hash is one scope's hashes in a batch (or in a read of Peek or Flush):
// per span group, its epochs, and the weight of the calls evaluated so far.
type hash struct {
	scope  string // what its hashes' names start with
	client bool   // a client's, not the resource's
	// whole: read whole (HGETALL of each epoch), not only the totals: some
	// call of the batch on it may be denied (it was not sent Far), or only
	// looks.
	whole    bool
	added    int // the batch's weight written to it
	admitted int // the batch's weight admitted so far
	denied   int // the batch's weight to take back
	pending  int // the batch's weight left undecided (see confirm)

	parts []part           // by span group
	lanes [][]limits.Entry // by lane: the intervals read whole but the current one, oldest first

	// Room for parts and lanes in the usual case, one span and one lane,
	// so that reading a hash allocates no more than the intervals it
	// holds.
	partRoom [1]part
	laneRoom [1][]limits.Entry
}

// part is a scope's hashes of one span group: of the epoch of the stamp,
// the one before, and the one after where the stamp is near the end of
// its own (see reach); and what was read of them.
type part struct {
	epoch int64     // the stamp's
	keys  [3]string // of the epochs before, of and after the stamp's ("" if not read)
	args  [3]any    // the same, boxed once for their commands
	reads [3]int    // each epoch's read among the replies, -1 if none
	kinds [3]readKind
	// The replies of the stamp's epoch's writes: its total and the
	// current interval, each with the batch's weight; -1 if none.
	total, interval int

	incarnation string // of the stamp's epoch's hash (a client's), as read
	totals      [3]int // each epoch's total, as read
	current     int    // the weight, but the batch's, of the interval the batch's calls count in (see hBatch.at)
}

// readKind is what one read of an epoch's hash asks for.
type readKind uint8

const (
	readWhole       readKind = iota // HGETALL
	readTotal                       // HGET of the total
	readIncarnation                 // HGET of the incarnation
)

// newHash returns the hashes of a scope whose names start with scope,
// around now: in each span group, the epoch of now and the one before,
// and the one after if reach says so. A span of fixed lanes alone counts
// only now's interval: the one epoch.
func (s windowsStore) newHash(scope string, client bool, now int64, reach func(g int) int64) *hash {
	h := &hash{}
	s.makeHash(h, scope, client, now, reach)
	return h
}

// makeHash makes h what newHash returns, in place: a batch makes its
// hashes in one array.
func (s windowsStore) makeHash(h *hash, scope string, client bool, now int64, reach func(g int) int64) {
	*h = hash{scope: scope, client: client}
	if len(s.Spans) == 1 {
		h.parts = h.partRoom[:0]
	} else {
		h.parts = make([]part, 0, len(s.Spans))
	}
	for g := range s.Spans {
		p := part{epoch: s.Epoch(g, now), reads: [3]int{-1, -1, -1}, total: -1, interval: -1}
		for i := range 2 + reach(g) {
			if i == 1 || s.sliding(g) {
				p.keys[i] = keys.Epoch(scope, g, p.epoch-1+i)
				p.args[i] = p.keys[i]
			}
		}
		h.parts = append(h.parts, p)
	}
}

// newHash is windowsStore.newHash for the batch, around its stamp, made in
// the batch's array of them.
func (b *hBatch) newHash(scope string, client bool) *hash {
	b.hashes = append(b.hashes, hash{})
	h := &b.hashes[len(b.hashes)-1]
	b.makeHash(h, scope, client, b.now, b.reach)
	return h
}

// read reads h from the replies of a transaction Redis ran at now, each
// span group at the time the batch's calls count in it (hBatch.at).
func (b *hBatch) read(h *hash, replies []any, now int64) {
	b.readAt(h, replies, func(g int) int64 { return b.at(g, now) })
	for g := range h.parts {
		p := &h.parts[g]
		switch {
		case p.wholeRead():
			b.unbatch(h, g, now)
		case p.interval >= 0:
			p.current = int(txn.ReplyInt(replies[p.interval])) - h.added
		}
	}
}

// readAt reads what h's reads and writes replied, each span group g's
// intervals counted from at(g): the totals, the incarnation, and the
// intervals of the hashes read whole.
func (s windowsStore) readAt(h *hash, replies []any, at func(g int) int64) {
	size := 0
	for g := range h.parts {
		for i, read := range h.parts[g].reads {
			if read >= 0 && h.parts[g].kinds[i] == readWhole {
				size += txn.ReplyLen(replies[read])
			}
		}
	}
	h.clearLanes(s.Layout, size)
	for g := range h.parts {
		p := &h.parts[g]
		if p.total >= 0 {
			p.totals[1] = int(txn.ReplyInt(replies[p.total]))
		}
		for i, read := range p.reads {
			if read >= 0 {
				p.readEpoch(s.Layout, g, i, replies[read], h.lanes, at(g)/s.Spans[g])
			}
		}
	}
	for l, entries := range h.lanes {
		sortStamps(entries, s.Lanes[l].Span)
	}
}

// readEpoch reads the reply of the read of p's i-th epoch, whose
// intervals of span group g go to lanes, but the current interval's,
// current.
func (p *part) readEpoch(y intervals.Layout, g, i int, reply any, lanes [][]limits.Entry, current int64) {
	switch p.kinds[i] {
	case readTotal:
		p.totals[i] = atoi(replyValue(reply))
	case readIncarnation:
		p.incarnation = replyValue(reply)
	default:
		p.parse(y, g, i, txn.ReplyFields(reply), lanes, current)
	}
}

// atoi reads a number Redis wrote, 0 if there is none ("": a field the
// hash does not hold), without the error a failed parse allocates.
func atoi(s string) int {
	if s == "" {
		return 0
	}
	n, _ := strconv.Atoi(s)
	return n
}

// replyValue reads the reply of HGET: "" for a field the hash does not
// hold.
func replyValue(v any) string {
	if v == nil {
		return ""
	}
	return txn.ReplyString(v)
}

// wholeRead reports whether p's epochs were read whole.
func (p *part) wholeRead() bool {
	for i, read := range p.reads {
		if read >= 0 && p.kinds[i] == readWhole {
			return true
		}
	}
	return false
}

// parse reads the fields of p's i-th epoch, of span group g: its total,
// its incarnation, and its intervals, to lanes but the current one, with
// what its pending fields add to them (see txn.Txn.Resend). Fields that
// are none of these are not ours.
func (p *part) parse(y intervals.Layout, g, i int, fields iter.Seq2[string, string], lanes [][]limits.Entry, current int64) {
	var pending []string // rare: only after a lost reply
	for field, value := range fields {
		switch {
		case field == intervals.IncarnationField:
			if i == 1 {
				p.incarnation = value
			}
		case field == totalField:
			p.totals[i] = atoi(value)
		case txn.IsPending(field):
			pending = append(pending, value)
		default:
			p.readInterval(y, g, i, field, value, lanes, current)
		}
	}
	for _, value := range pending {
		p.unpend(y, g, i, value, lanes, current)
	}
}

// unpend adds what the pending field value of p's i-th epoch's hash, of
// span group g, holds to the intervals read: to lanes, or to p.current
// for the current one. An interval left with no weight, or less, counts
// none.
func (p *part) unpend(y intervals.Layout, g, i int, value string, lanes [][]limits.Entry, current int64) {
	for field, n := range txn.Pending(value) {
		index, ok := y.Interval(g, p.epoch-1+int64(i), field)
		switch {
		case !ok: // not ours
		case index == current:
			p.current += n
		default:
			for _, l := range y.LanesOf[g] {
				lanes[l] = withPending(lanes[l], limits.Entry{ID: field, At: y.Lanes[l].At(index), Weight: n})
			}
		}
	}
}

// readInterval reads one field of p's i-th epoch's hash, of span group g,
// if it is one of its intervals: to lanes, or to p.current if it is the
// current one.
func (p *part) readInterval(y intervals.Layout, g, i int, field, value string, lanes [][]limits.Entry, current int64) {
	index, ok := y.Interval(g, p.epoch-1+int64(i), field)
	n, err := strconv.Atoi(value)
	switch {
	case !ok || err != nil: // not ours
	case index == current:
		p.current = n
	case n > 0:
		for _, l := range y.LanesOf[g] {
			lanes[l] = append(lanes[l], limits.Entry{ID: field, At: y.Lanes[l].At(index), Weight: n})
		}
	}
}

// unbatch takes the batch's weight out of what was read whole of h in
// span group g: out of the current interval, or, for a span whose calls
// are moved, out of the stamp's interval, which is a past one there.
func (b *hBatch) unbatch(h *hash, g int, now int64) {
	if !b.moves(g, now) {
		h.parts[g].current -= h.added
		return
	}
	span := b.Spans[g]
	for _, l := range b.LanesOf[g] {
		h.lanes[l] = withWeight(h.lanes[l], b.Lanes[l].At(b.now/span), -h.added)
	}
}

// readIncarnations reads the incarnations of h's hashes of the stamp's
// epoch from the replies of a transaction whose calls are all taken back.
func (b *hBatch) readIncarnations(h *hash, replies []any) {
	for g := range h.parts {
		p := &h.parts[g]
		switch read := p.reads[1]; {
		case read < 0:
		case p.kinds[1] == readIncarnation:
			p.incarnation = replyValue(replies[read])
		case p.kinds[1] == readWhole:
			for field, value := range txn.ReplyFields(replies[read]) {
				if field == intervals.IncarnationField {
					p.incarnation = value
				}
			}
		}
	}
}

// clearLanes empties h's lanes, with room for size intervals each.
func (h *hash) clearLanes(y intervals.Layout, size int) {
	h.lanes = h.laneRoom[:]
	if len(y.Lanes) > len(h.laneRoom) {
		h.lanes = make([][]limits.Entry, len(y.Lanes))
	}
	for l := range h.lanes {
		// Room for every field, and for withCurrent: one allocation,
		// not one per doubling.
		h.lanes[l] = make([]limits.Entry, 0, size+1)
	}
}

// bound is what any sliding rule of p's span group g counts at most at
// now: the totals of the epochs its windows reach, the one of now and the
// one before (a window is never longer than an epoch). Each is at least
// what the intervals of its epoch hold (totalField), so their sum is at
// least what any window of them holds, counted as a whole read counts it
// (an interval's weight, or none if less).
func (p *part) bound(y intervals.Layout, g int, now int64) int {
	from := y.Epoch(g, now) - 1
	sum := 0
	for i, total := range p.totals {
		if p.epoch-1+int64(i) >= from {
			sum += total
		}
	}
	return sum
}

// count is what rule r counts in h at now, for a call made at at (now, or
// the batch's stamp, which chose the interval the call was added to: see
// hBatch.at), with the weight the batch admitted in h so far.
//
// On a hash read far, a sliding rule counts the bound of its epochs'
// totals (limits.Count.Bounded): at least what a whole read counts, and
// newest at most at now's interval, where a call may be moved (no call
// counts later than the transaction that recorded it).
//
// A fixed rule counts at at, not now: a call whose estimate was still in
// the last window when Redis ran the transaction in the next was added to
// the last window's interval, and is evaluated with the calls of that window
// (see errCrossed).
func (s windowsStore) count(h *hash, r int, rule limits.Rule, at, now int64) limits.Count {
	l := s.Lane(r)
	stamp := l.Stamp(at)
	p := &h.parts[l.Group]
	if l.Fixed {
		c := rule.CountOf(withCurrent(h.lanes[s.OfRule[r]], stamp, p.current+h.admitted), at)
		c.Stamp = stamp
		return c
	}
	bound := max(p.bound(s.Layout, l.Group, now)-h.added+h.admitted, 0)
	if !h.whole {
		return limits.Count{Stamp: stamp, Used: bound, Bound: bound, Bounded: true, Newest: l.Stamp(now)}
	}
	c := rule.CountOf(withCurrent(h.lanes[s.OfRule[r]], stamp, p.current+h.admitted), now)
	c.Bound, c.Stamp = bound, stamp
	return c
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

// withCurrent returns a lane's intervals with the current one, stamped at
// stamp, holding weight. It is the newest unless another process wrote to
// a later interval (its estimate of Redis's clock is ahead of this one's);
// then the intervals are copied, else the current one goes in the room
// parse left, so that a batch evaluates its calls without allocating: the
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

// withPending adds e's weight, a pending one, to the entry stamped as e
// among entries as parse reads them, in no order yet (pending fields are
// rare: a scan), and drops it if it holds no weight then; it adds e if
// there is none and e holds weight (an interval that held none, or less,
// is counted as holding none).
func withPending(entries []limits.Entry, e limits.Entry) []limits.Entry {
	i := slices.IndexFunc(entries, func(x limits.Entry) bool { return x.At == e.At })
	switch {
	case i < 0 && e.Weight > 0:
		return append(entries, e)
	case i < 0:
		return entries
	}
	if entries[i].Weight += e.Weight; entries[i].Weight <= 0 {
		return slices.Delete(entries, i, i+1)
	}
	return entries
}
