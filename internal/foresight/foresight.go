// Package foresight judges calls on what this process last saw of their
// counts, before they are sent. SortedSet and Windows write a call before
// they judge it, in one MULTI/EXEC, and take back the weight of a call
// that turns out denied in a second one. Until then, every other decision counts that weight: a
// client hammering past its own limit would keep the resource's count full
// of calls that will all be denied, and starve the polite clients beside
// it. So before a batch is sent, each call is judged on what this process
// last saw of its counts, moved on to now (the calls that have left their
// windows since are dropped): a call for which some rule showed no room is
// sent to look only. It writes nothing anywhere; it is judged on the
// counts its transaction read, denied if they have no room, and if they do
// (the counts fell meanwhile: a flush, another process's take-back) it is
// decided again at once, judged again by what it read: of a batch's calls
// that found room, as many as the room holds write. So weight is written
// only for calls that every rule showed room for, and a client past its
// own limit writes none.
//
// A call that every rule showed room for with a margin beside it is sent
// Far (limits.Call): its store may leave out the reads only a denial
// needs, or read only a bound of the counts, and the call is decided
// again, on a full read, if what was read cannot decide it
// (limits.View.Undecided).
//
// What foresight saw can only be too full where it is stale (counts fall
// only by flushes and take-backs, which the second round catches), or too
// empty (other processes admitted since): then a call is written that the
// counts deny, and taken back, as before. That weight is at most the room
// its rules showed this process, never a hammering client's.
package foresight

import (
	"sync"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// maxForeseen bounds the counts foresight keeps; past it, it forgets those
// whose every call has left the longest window, then everything.
const maxForeseen = 1 << 16

// seenEntries bounds the oldest calls kept of one count: enough to see
// room come back as they leave their windows. A count whose kept calls
// have all left but which counted more stays as full as it was, which errs
// on the side of looking. With maxForeseen, it bounds foresight's memory
// to about 16 MB.
const seenEntries = 8

// A Foresight is what this process last saw of each count: of a
// per-resource rule at a resource, or of a per-client rule of one client.
type Foresight struct {
	rules   []limits.Rule
	longest int64 // the longest window, ms

	mu   sync.Mutex
	seen map[seenKey]seenCount // guarded by mu
	// written is Foresee's scratch, guarded by mu: the weight of a batch's
	// calls marked to write, by count. It is cleared, not made, for each
	// batch (a map per batch was 3 % of the bytes a decision allocated),
	// and made again after a batch that grew it past reuseWritten.
	written map[seenKey]int
}

// reuseWritten is the most entries Foresee's scratch map is kept for:
// clearing a map costs its size, and a batch of hundreds of calls is rare.
const reuseWritten = 256

// New returns the foresight of a Bucket of rules, whose longest window is
// longest ms.
func New(rules []limits.Rule, longest int64) *Foresight {
	return &Foresight{rules: rules, longest: longest}
}

type seenKey struct {
	resource, client string // client is "" for a per-resource rule
	rule             int
}

// seenCount is one rule's count after a call, as its transaction read it.
type seenCount struct {
	at     int64      // Redis time, ms
	used   int        // the weight counted
	bound  int        // limits.Count.Bound, 0 if none
	oldest []seenCall // the oldest calls counted, at most seenEntries
}

// seenCall is a counted call: its stamp (see limits.Count.Stamp) and weight.
type seenCall struct {
	at     int64
	weight int
}

// seenKeyOf is where rule r keeps what a call by client saw.
func (f *Foresight) seenKeyOf(resource, client string, r int) seenKey {
	if !f.rules[r].PerClient {
		client = ""
	}
	return seenKey{resource: resource, client: client, rule: r}
}

// atLeast is the least of call c that must fit for it to be admitted: a
// call AtMost (limits.Call.AtMost) needs room for one unit, and looks only
// if some rule showed none. It is never sent Far: its Weight is taken from
// the counts, which a bound would overstate.
func atLeast(c limits.Call) limits.Call {
	if c.AtMost {
		c.N = 1
	}
	return c
}

// Foresee marks each call that some rule showed no room for, in order: a
// call that is written counts for the calls after it. now is the estimate
// of Redis's time.
func (f *Foresight) Foresee(resource string, calls []limits.Call, now int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.written == nil {
		f.written = map[seenKey]int{}
	}
	defer f.clearWritten()
	for i := range calls {
		room, far := f.roomFor(resource, atLeast(calls[i]), now, f.written)
		calls[i].Look, calls[i].Far = !room, far && !calls[i].AtMost
		if !room {
			continue
		}
		for r := range f.rules {
			f.written[f.seenKeyOf(resource, calls[i].Client, r)] += calls[i].N
		}
	}
}

// clearWritten empties Foresee's scratch for the next batch, or drops it
// if this one grew it past reuseWritten. f.mu is held.
func (f *Foresight) clearWritten() {
	if len(f.written) > reuseWritten {
		f.written = nil
		return
	}
	clear(f.written)
}

// roomFor reports whether every rule showed room for c, on top of the
// batch's calls before it, and whether each showed its margin
// (limits.Rule.Margin) beside it too, on what a Far call's read would show
// (farUsed). f.mu is held.
func (f *Foresight) roomFor(resource string, c limits.Call, now int64, written map[seenKey]int) (room, far bool) {
	far = true
	for r, rule := range f.rules {
		k := f.seenKeyOf(resource, c.Client, r)
		seen := f.seen[k]
		used := limits.AddCapped(seen.usedAt(rule, now), written[k])
		if !rule.HasRoom(used, c.N) {
			return false, false
		}
		farUsed := limits.AddCapped(seen.farUsed(rule, now), written[k])
		far = far && rule.HasRoom(limits.AddCapped(farUsed, rule.Margin()), c.N)
	}
	return true, far
}

// farUsed is what a Far call's read would show of s at now: its bound
// where the store keeps one (limits.Count.Bound), which is not moved on
// (the totals of an epoch only grow until it passes), else usedAt. A call
// whose read then leaves less than a margin is decided again (see
// limits.View.Undecided): foreseeing the bound keeps a client that its
// bound shows near its limit from paying that every other call.
func (s seenCount) farUsed(rule limits.Rule, now int64) int {
	if s.bound > 0 {
		return s.bound
	}
	return s.usedAt(rule, now)
}

// usedAt is what s counts at now: less the calls that have left rule's
// window since. A count never seen counts nothing.
func (s seenCount) usedAt(rule limits.Rule, now int64) int {
	used := s.used
	for _, e := range s.oldest {
		if e.at+rule.Window > now {
			break // counted still, and so are those after it
		}
		used -= e.weight
	}
	return max(used, 0)
}

// Saw keeps what each rule counted after a call by client: v, plus the
// call's weight n if it was recorded.
func (f *Foresight) Saw(resource, client string, v limits.View, n int, recorded bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[seenKey]seenCount{}
	}
	if len(f.seen) >= maxForeseen {
		f.forget(v.Now)
	}
	for r, c := range v.Counts {
		k := f.seenKeyOf(resource, client, r)
		// The old count's room is reused: it is read only under f.mu.
		s := seenCount{at: v.Now, used: c.Used, bound: c.Bound, oldest: f.seen[k].oldest[:0]}
		for _, e := range c.Oldest[:min(len(c.Oldest), seenEntries)] {
			s.oldest = append(s.oldest, seenCall{at: e.At, weight: e.Weight})
		}
		if recorded {
			s.used = limits.AddCapped(s.used, n)
			if s.bound > 0 {
				s.bound = limits.AddCapped(s.bound, n)
			}
			if len(s.oldest) < seenEntries {
				s.oldest = append(s.oldest, seenCall{at: c.Stamp, weight: n})
			}
		}
		f.seen[k] = s
	}
}

// Copy returns what Saw reads of v, in slices of its own: a store lends
// its View only while it evaluates a call, and Saw runs once the round is
// over.
func Copy(v limits.View) limits.View {
	n := 0
	for _, c := range v.Counts {
		n += min(len(c.Oldest), seenEntries)
	}
	counts, oldest := make([]limits.Count, len(v.Counts)), make([]limits.Entry, 0, n)
	for r, c := range v.Counts {
		from := len(oldest)
		oldest = append(oldest, c.Oldest[:min(len(c.Oldest), seenEntries)]...)
		counts[r] = c
		counts[r].Oldest = oldest[from:len(oldest):len(oldest)]
	}
	v.Counts = counts
	return v
}

// forget drops the counts whose calls have all left the longest window at
// now, and everything if that is not enough. f.mu is held.
func (f *Foresight) forget(now int64) {
	for k, s := range f.seen {
		if s.at+f.longest <= now {
			delete(f.seen, k)
		}
	}
	if len(f.seen) >= maxForeseen {
		clear(f.seen)
	}
}

// Drop forgets what was seen at resource: of client, or of every client
// if client is nil. A flush makes it stale.
func (f *Foresight) Drop(resource string, client *string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k := range f.seen {
		if k.resource == resource && (client == nil || k.client == *client || k.client == "") {
			delete(f.seen, k)
		}
	}
}
