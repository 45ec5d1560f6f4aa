package leakybucket

import (
	"cmp"
	"strconv"
	"strings"
	"time"
)

// How the Windows strategy counts time. Each rule counts in intervals of
// its precision (its Limit's, else the strategy's), numbered from the Unix
// epoch in Redis time: interval i of span s holds the calls made in
// [i*s, (i+1)*s). A sliding rule counts the calls of an interval as made
// at its last millisecond, so that none leaves a window early; a fixed
// rule (no precision at all, under Windows(0)) counts them from its first,
// so that they all leave together at the interval's end, the window's
// boundary. A rule is thus one of a few lanes: a span and a way to stamp.
//
// The lanes of one span count the same calls, so they share the fields of
// a hash: one per interval. The fields of the first span are named by the
// interval's number alone, as they were when a Bucket had one precision,
// so that a Bucket of one precision keeps its keys; those of the others
// by "<span in ms>:<number>".

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
// the last whose stamp is at least longest before now.
func (l lane) lastDead(now int64) int64 {
	if l.fixed {
		return now/l.span - 1
	}
	return (now+1-l.longest)/l.span - 1
}

// layout is the lanes of a Bucket's rules, and how their hash fields are
// named.
type layout struct {
	lanes   []lane
	ofRule  []int    // the lane of each rule
	spans   []int64  // the spans, in the order of the rules that use them first
	names   []string // the spans in decimal, as the fields name them
	lanesOf [][]int  // the lanes of each span
}

// newLayout returns the layout of rules under Windows(precision): a rule
// without a precision of its own counts in intervals of precision, or in
// fixed windows if precision is 0.
func newLayout(precision time.Duration, rules []Rule) layout {
	var y layout
	for _, r := range rules {
		l := lane{span: r.Limit.Window.Milliseconds(), fixed: true}
		if p := cmp.Or(r.Limit.Precision, precision); p != 0 {
			l = lane{span: p.Milliseconds()}
		}
		y.ofRule = append(y.ofRule, y.add(l, r.Limit.windowMillis()))
	}
	return y
}

// add adds a rule of window ms to lane l, and returns l's index.
func (y *layout) add(l lane, window int64) int {
	for i, have := range y.lanes {
		if have.span == l.span && have.fixed == l.fixed {
			y.lanes[i].longest = max(have.longest, window)
			return i
		}
	}
	l.group = len(y.spans)
	for g, span := range y.spans {
		if span == l.span {
			l.group = g
		}
	}
	if l.group == len(y.spans) {
		y.spans = append(y.spans, l.span)
		y.names = append(y.names, strconv.FormatInt(l.span, 10))
		y.lanesOf = append(y.lanesOf, nil)
	}
	l.longest = window
	y.lanesOf[l.group] = append(y.lanesOf[l.group], len(y.lanes))
	y.lanes = append(y.lanes, l)
	return len(y.lanes) - 1
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

// expireAt is when a hash written at now has no interval left that a rule
// counts.
func (y layout) expireAt(now int64) int64 {
	var at int64
	for _, l := range y.lanes {
		at = max(at, l.stamp(now)+l.longest)
	}
	return at
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
