package leakybucket

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// How the Windows strategy counts time. Each rule counts in intervals of
// its precision (its Limit's, else the strategy's), numbered from the Unix
// epoch in Redis time: interval i of span s holds the calls made in
// [i*s, (i+1)*s). A sliding rule counts the calls of an interval as made
// at its last millisecond, so that none leaves a window early; a fixed
// rule (no precision at all, under FixedWindows) counts them from its first,
// so that they all leave together at the interval's end, the window's
// boundary. A rule is thus one of a few lanes: a span and a way to stamp.
//
// The lanes of one span count the same calls, so they share the fields of
// a hash: one per interval. The fields of the shortest span are named by
// the interval's number alone, as they were when a Bucket had one
// precision, so that a Bucket of one precision keeps its keys; those of the
// others by "<span in ms>:<number>". Lanes are ordered by span, sliding
// before fixed, not by the order of the rules: a deploy that only reorders
// its rules keeps its keys, so its old and new processes share counts.

// lane is how some of a Bucket's rules count: in intervals of span ms,
// stamped at their last millisecond, or at their first if fixed.
type lane struct {
	span    int64
	fixed   bool
	longest int64 // the longest window of its rules, ms: a fixed one's is span
	group   int   // the index of span in layout.spans
}

// at is the stamp of interval index: when its calls start to leave the
// lane's windows, less each window.
func (l lane) at(index int64) int64 {
	if l.fixed {
		return index * l.span
	}
	return (index+1)*l.span - 1
}

// stamp is the stamp of now's interval.
func (l lane) stamp(now int64) int64 { return l.at(now / l.span) }

// lastDead is the newest interval that no rule of the lane counts at now:
// the last whose stamp is at least longest before now. A fixed lane is
// judged at its decision's stamp, which may trail Redis's time by up to
// lagLimit: its last window stays alive that much longer, so that a
// decision stamped just before the boundary still finds it (and no HDEL
// takes it first).
func (l lane) lastDead(now int64) int64 {
	if l.fixed {
		return (now-lagLimit.Milliseconds())/l.span - 1
	}
	return (now+1-l.longest)/l.span - 1
}

// expireAt is when a hash may expire once a call stamped now counted in
// it: when the call's interval leaves the lane's longest window (a sliding
// lane counts at Redis's own time, so its reads never need more), and for
// a fixed lane lagLimit later (see lastDead).
func (l lane) expireAt(now int64) int64 {
	at := l.stamp(now) + l.longest
	if l.fixed {
		at += lagLimit.Milliseconds()
	}
	return at
}

// layout is the lanes of a Bucket's rules, and how their hash fields are
// named.
type layout struct {
	lanes   []lane
	ofRule  []int    // the lane of each rule
	spans   []int64  // the spans, shortest first (see newLayout)
	names   []string // the spans in decimal, as the fields name them: kept, not formatted per field
	lanesOf [][]int  // the lanes of each span
}

// newLayout returns the layout of rules under Windows(precision): a rule
// without a precision of its own counts in intervals of precision, or in
// fixed windows if precision is 0 (FixedWindows).
func newLayout(precision time.Duration, rules []limits.Rule) layout {
	var y layout
	laneOf := func(r limits.Rule) lane {
		if p := cmp.Or(r.Precision, precision.Milliseconds()); p != 0 {
			return lane{span: p}
		}
		return lane{span: r.Window, fixed: true}
	}
	for _, r := range rules {
		y.addLane(laneOf(r), r.Window)
	}
	slices.SortFunc(y.lanes, func(a, b lane) int {
		return cmp.Or(cmp.Compare(a.span, b.span), cmp.Compare(fixedOrder(a.fixed), fixedOrder(b.fixed)))
	})
	for i, l := range y.lanes {
		if len(y.spans) == 0 || y.spans[len(y.spans)-1] != l.span {
			y.spans = append(y.spans, l.span)
			y.names = append(y.names, strconv.FormatInt(l.span, 10))
			y.lanesOf = append(y.lanesOf, nil)
		}
		y.lanes[i].group = len(y.spans) - 1
		y.lanesOf[y.lanes[i].group] = append(y.lanesOf[y.lanes[i].group], i)
	}
	for _, r := range rules {
		want := laneOf(r)
		y.ofRule = append(y.ofRule, slices.IndexFunc(y.lanes, want.same))
	}
	return y
}

// addLane adds a rule of window ms to lane l, made if need be.
func (y *layout) addLane(l lane, window int64) {
	if i := slices.IndexFunc(y.lanes, l.same); i >= 0 {
		y.lanes[i].longest = max(y.lanes[i].longest, window)
		return
	}
	l.longest = window
	y.lanes = append(y.lanes, l)
}

// same reports whether o counts as l does: the same span and stamping.
func (l lane) same(o lane) bool { return l.span == o.span && l.fixed == o.fixed }

// fixedOrder orders a sliding lane before a fixed one of the same span.
func fixedOrder(fixed bool) int {
	if fixed {
		return 1
	}
	return 0
}

// lane returns the lane of rule r.
func (y layout) lane(r int) lane { return y.lanes[y.ofRule[r]] }

// fieldName names interval index of span group g.
func (y layout) fieldName(g int, index int64) string {
	if g == 0 {
		return strconv.FormatInt(index, 10)
	}
	return y.names[g] + ":" + strconv.FormatInt(index, 10)
}

// current is the field of now's interval in span group g: an int64 for
// the first span, which go-redis writes without a string made for it.
func (y layout) current(g int, now int64) any {
	if g == 0 {
		return now / y.spans[0]
	}
	return y.fieldName(g, now/y.spans[g])
}

// interval parses a field: its span group and interval; ok is false for a
// field that is not one of ours.
func (y layout) interval(field string) (g int, index int64, ok bool) {
	if index, ok := digits(field); ok {
		return 0, index, true // the first span's, as most are
	}
	if field == txn.IncarnationField {
		return 0, 0, false // no number: known without a parse, whose error allocates
	}
	span, number, prefixed := strings.Cut(field, ":")
	if !prefixed {
		number = field
	}
	index, err := strconv.ParseInt(number, 10, 64)
	if err != nil {
		return 0, 0, false
	}
	if !prefixed {
		return 0, index, true
	}
	for g := 1; g < len(y.names); g++ {
		if y.names[g] == span {
			return g, index, true
		}
	}
	return 0, 0, false
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

// lastDead is the newest interval of span group g that no rule counts at
// now.
func (y layout) lastDead(g int, now int64) int64 {
	dead := int64(0)
	for i, l := range y.lanesOf[g] {
		if d := y.lanes[l].lastDead(now); i == 0 || d < dead {
			dead = d
		}
	}
	return dead
}

// bounds are the intervals of a span group at some time: the newest that
// no rule counts (lastDead), and the current one.
type bounds struct{ dead, current int64 }

// bounds returns span group g's at now.
func (y layout) bounds(g int, now int64) bounds {
	return bounds{dead: y.lastDead(g, now), current: now / y.spans[g]}
}

// expireAt is when a hash written at now may expire: once no rule counts
// the interval of a call stamped now (lane.expireAt). That is at most one
// precision after the window of a call made at now ends (its interval's
// end), or lagLimit after a fixed window's. A hash is only ever given a
// later deadline, never an earlier one (PEXPIREAT NX, then GT: see
// windowsStore).
func (y layout) expireAt(now int64) int64 {
	var at int64
	for _, l := range y.lanes {
		at = max(at, l.expireAt(now))
	}
	return at
}

// genLife is how long Windows' generation key lives after a FlushAll (and
// after the decisions of its generation, which extend it to their hashes'
// deadline): longer than any hash written before the FlushAll, which a late
// decision or take-back may have made again under the old generation's
// name, can hold an interval any rule counts. See windowsStore.flushAll.
func (y layout) genLife() time.Duration {
	var life int64
	for _, l := range y.lanes {
		life = max(life, l.span+l.longest)
	}
	return time.Duration(life)*time.Millisecond + lagLimit
}

// tag names the layout in the keys, as w<longest>p<span> per lane (f<span>
// for a fixed one): Buckets whose lanes differ in span, stamping or
// longest window number or keep their intervals differently. A Bucket of
// one precision has the tag it had before rules had precisions.
func (y layout) tag() string {
	var b strings.Builder
	for _, l := range y.lanes {
		kind := "p"
		if l.fixed {
			kind = "f"
		}
		b.WriteString("w" + strconv.FormatInt(l.longest, 10) + kind + strconv.FormatInt(l.span, 10))
	}
	return b.String()
}
