// Package intervals is how the Windows strategies count time. Each rule counts in intervals of
// its precision (its Limit's, else the strategy's), numbered from the Unix
// epoch in Redis time: interval i of span s holds the calls made in
// [i*s, (i+1)*s). A sliding rule counts the calls of an interval as made
// at its last millisecond, so that none leaves a window early; a fixed
// rule (no precision at all, under FixedWindows) counts them from its first,
// so that they all leave together at the interval's end, the window's
// boundary. A rule is thus one of a few lanes: a span and a way to stamp.
//
// The lanes of one span count the same calls, so they share the fields of
// a hash: one per interval, named by its offset in its epoch (below).
// Lanes are ordered by span, sliding before fixed, not by the order of the
// rules: a deploy that only reorders its rules keeps its keys, so its old
// and new processes share counts.
//
// The intervals of a span live in a hash per epoch: a stretch of time as
// long as the longest window of its lanes, rounded up to a whole number
// of intervals, counted from the Unix epoch. A window then reaches into
// the current epoch and the one before, never further, and an epoch's
// hash may expire, whole, once the last of its intervals left every
// window (EpochExpireAt): no interval is ever deleted on its own.
package intervals

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// IncarnationField is the field of a client's hash that names the hash's
// incarnation, set by the decision that makes it: a take-back of a weight
// applies only while the hash is the one the weight was written to (a
// txn.Guard on this field). Not digits, it names no interval.
const IncarnationField = "i"

// Lane is how some of a Bucket's rules count: in intervals of span ms,
// stamped at their last millisecond, or at their first if fixed.
type Lane struct {
	Span    int64
	Fixed   bool
	Longest int64 // the longest window of its rules, ms: a fixed one's is span
	Group   int   // the index of span in Layout.Spans
}

// At is the stamp of interval index: when its calls start to leave the
// lane's windows, less each window.
func (l Lane) At(index int64) int64 {
	if l.Fixed {
		return index * l.Span
	}
	return (index+1)*l.Span - 1
}

// Stamp is the Stamp of now's interval.
func (l Lane) Stamp(now int64) int64 { return l.At(now / l.Span) }

// ExpireAt is when a hash may expire once a call stamped now counted in
// it: when the call's interval leaves the lane's longest window (a sliding
// lane counts at Redis's own time, so its reads never need more), and for
// a fixed lane clock.LagLimit later: a fixed lane is judged at its
// decision's stamp, which may trail Redis's time by up to clock.LagLimit,
// so its last window must outlive its end that much, for a decision
// stamped just before the boundary to still find it.
func (l Lane) ExpireAt(now int64) int64 {
	at := l.Stamp(now) + l.Longest
	if l.Fixed {
		at += clock.LagLimit.Milliseconds()
	}
	return at
}

// Layout is the lanes of a Bucket's rules, and how their hash fields are
// named.
type Layout struct {
	Lanes   []Lane
	OfRule  []int   // the lane of each rule
	Spans   []int64 // the spans, shortest first (see New)
	LanesOf [][]int // the lanes of each span
	Epochs  []int64 // the epoch of each span, ms: its lanes' longest window, in whole intervals
}

// New returns the layout of rules under Windows(precision): a rule
// without a precision of its own counts in intervals of precision, or in
// fixed windows if precision is 0 (FixedWindows).
func New(precision time.Duration, rules []limits.Rule) Layout {
	var y Layout
	laneOf := func(r limits.Rule) Lane {
		if p := cmp.Or(r.Precision, precision.Milliseconds()); p != 0 {
			return Lane{Span: p}
		}
		return Lane{Span: r.Window, Fixed: true}
	}
	for _, r := range rules {
		y.addLane(laneOf(r), r.Window)
	}
	slices.SortFunc(y.Lanes, func(a, b Lane) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), cmp.Compare(fixedOrder(a.Fixed), fixedOrder(b.Fixed)))
	})
	for i, l := range y.Lanes {
		if len(y.Spans) == 0 || y.Spans[len(y.Spans)-1] != l.Span {
			y.Spans = append(y.Spans, l.Span)
			y.LanesOf = append(y.LanesOf, nil)
		}
		y.Lanes[i].Group = len(y.Spans) - 1
		y.LanesOf[y.Lanes[i].Group] = append(y.LanesOf[y.Lanes[i].Group], i)
	}
	for _, r := range rules {
		want := laneOf(r)
		y.OfRule = append(y.OfRule, slices.IndexFunc(y.Lanes, want.same))
	}
	for g, span := range y.Spans {
		var longest int64
		for _, l := range y.LanesOf[g] {
			longest = max(longest, y.Lanes[l].Longest)
		}
		y.Epochs = append(y.Epochs, (longest+span-1)/span*span)
	}
	return y
}

// addLane adds a rule of window ms to lane l, made if need be.
func (y *Layout) addLane(l Lane, window int64) {
	if i := slices.IndexFunc(y.Lanes, l.same); i >= 0 {
		y.Lanes[i].Longest = max(y.Lanes[i].Longest, window)
		return
	}
	l.Longest = window
	y.Lanes = append(y.Lanes, l)
}

// same reports whether o counts as l does: the same span and stamping.
func (l Lane) same(o Lane) bool { return l.Span == o.Span && l.Fixed == o.Fixed }

// fixedOrder orders a sliding lane before a fixed one of the same span.
func fixedOrder(fixed bool) int {
	if fixed {
		return 1
	}
	return 0
}

// Kinds reports whether span group g has a fixed lane, and a sliding one.
func (y Layout) Kinds(g int) (fixed, sliding bool) {
	for _, l := range y.LanesOf[g] {
		fixed, sliding = fixed || y.Lanes[l].Fixed, sliding || !y.Lanes[l].Fixed
	}
	return fixed, sliding
}

// Lane returns the Lane of rule r.
func (y Layout) Lane(r int) Lane { return y.Lanes[y.OfRule[r]] }

// Current is the field of now's interval in span group g's epoch: its
// offset in the epoch, in decimal (the epoch is in the hash's name), an
// int64, which go-redis writes without a string made for it.
func (y Layout) Current(g int, now int64) any { return y.offset(g, now/y.Spans[g]) }

// offset is interval index's place in its epoch of span group g.
func (y Layout) offset(g int, index int64) int64 { return index % (y.Epochs[g] / y.Spans[g]) }

// Interval reads a field of the hash of span group g's epoch e: the
// interval it names, and false for a field that names none.
func (y Layout) Interval(g int, e int64, field string) (int64, bool) {
	off, ok := digits(field)
	if perEpoch := y.Epochs[g] / y.Spans[g]; ok && off < perEpoch {
		return e*perEpoch + off, true
	}
	return 0, false
}

// digits reads a field of decimal digits alone, as FormatInt writes a
// positive number, without the general parse's cost; ok is false for any
// other field, left to it.
func digits(field string) (int64, bool) {
	if len(field) == 0 || len(field) > 18 { // 18 digits cannot overflow
		return 0, false
	}
	var n int64
	for i := 0; i < len(field); i++ {
		d := field[i] - '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int64(d)
	}
	return n, true
}

// Epoch is the epoch of span group g that time at (ms) is in.
func (y Layout) Epoch(g int, at int64) int64 { return at / y.Epochs[g] }

// EpochExpireAt is when the hash of span group g's epoch e may expire:
// once its last interval left every window (Lane.ExpireAt of its last
// millisecond). It is the same for every writer, so a hash's deadline is
// set once and never moved, by whoever writes to it first or last.
func (y Layout) EpochExpireAt(g int, e int64) int64 {
	last := (e+1)*y.Epochs[g] - 1
	var at int64
	for _, l := range y.LanesOf[g] {
		at = max(at, y.Lanes[l].ExpireAt(last))
	}
	return at
}

// GenLife is how long Windows' generation key lives after a FlushAll (and
// after the decisions of its generation, which extend it to their hashes'
// deadline): longer than any hash written before the FlushAll, which a late
// decision or take-back may have made again under the old generation's
// name, can hold an interval any rule counts. See the Windows store's
// flushAll.
func (y Layout) GenLife() time.Duration {
	var life int64
	for _, l := range y.Lanes {
		life = max(life, l.Span+l.Longest)
	}
	return time.Duration(life)*time.Millisecond + clock.LagLimit
}

// Tag names the layout in the keys, as w<longest>p<span> per lane (f<span>
// for a fixed one): Buckets whose lanes differ in span, stamping or
// longest window number or keep their intervals differently. A Bucket of
// one precision has the Tag it had before rules had precisions.
func (y Layout) Tag() string {
	var b strings.Builder
	for _, l := range y.Lanes {
		kind := "p"
		if l.Fixed {
			kind = "f"
		}
		b.WriteString("w" + strconv.FormatInt(l.Longest, 10) + kind + strconv.FormatInt(l.Span, 10))
	}
	return b.String()
}
