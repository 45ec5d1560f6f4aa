// Package limits is what every count is judged by: a rule's limit in
// milliseconds, the calls to judge (Call), the calls a count holds
// (Entry), and what each rule counted before a call (Count, View). The
// root package turns its public Rule into a Rule here; nothing here knows
// where the counts live.
package limits

import (
	"math"
	"sort"
)

// A Rule admits at most Requests of weight in any Window: per client, or
// per resource.
type Rule struct {
	PerClient bool
	Requests  int
	Window    int64 // ms
	Precision int64 // ms, the intervals Windows counts in; 0: the strategy's
}

// An Entry is one counted call (or, under Windows, one interval's calls).
type Entry struct {
	ID     string // its key, member or field
	Client string // base64url, as in the keys; empty under Windows
	At     int64  // when it is counted from (see Count.Stamp), ms
	Weight int
}

// A Count is what one rule counts before a call.
type Count struct {
	// Stamp is when the call starts to leave the rule's window, less the
	// window: the time of the call, or under Windows its interval's.
	Stamp int64
	Used  int
	// Oldest are the counted calls, oldest first: all of them, or at
	// least as many as must leave the window for the call to fit.
	Oldest []Entry
	Newest int64 // the stamp of the newest counted call, if Used > 0
	// Bound is what a coarse read would count (Windows' blocks, counted
	// whole: see the Windows store), at least Used: foresight keeps it to
	// tell which calls a coarse read could decide.
	Bound int
}

// A Call is one call to decide, of weight N by Client.
type Call struct {
	Client string
	N      int
	// Look: the call writes nothing, and is only judged (foresight saw
	// no room for it): a store must neither record it nor take it back.
	Look bool
	// Near: some rule may leave the call less than Margin's room, so its
	// counts must be read exactly (Windows reads its hashes whole).
	Near bool
}

// A View is what was read for one call.
type View struct {
	Now    int64   // Redis time, ms
	Counts []Count // by rule, in the order of the rules
	// Undecided: what was read bounds the counts but cannot decide the
	// call (Windows read its coarse blocks, and they left too little room):
	// it was not recorded, and must be decided again, Near.
	Undecided bool
}

// Counts reports whether r counts e at time now.
func (r Rule) Counts(e Entry, now int64) bool { return e.At+r.Window > now }

// HasRoom reports whether n more fit beside used. It compares room, not
// used+n, which could overflow.
func (r Rule) HasRoom(used, n int) bool { return r.Requests-used >= n }

// CountOf is what r counts at now among entries, sorted oldest first: the
// entries it counts are the newest ones, a tail of entries, shared rather
// than copied (a batch asks once per call and rule).
func (r Rule) CountOf(entries []Entry, now int64) Count {
	from := sort.Search(len(entries), func(i int) bool { return r.Counts(entries[i], now) })
	c := Count{Oldest: entries[from:]}
	for _, e := range c.Oldest {
		c.Used = AddCapped(c.Used, e.Weight)
	}
	if len(c.Oldest) > 0 {
		c.Newest = c.Oldest[len(c.Oldest)-1].At
	}
	return c
}

// UntilRoom returns the ms until enough of the counted entries (oldest
// first) have left r's window for n more to fit; 0 if they fit now.
// Rooms only grow as time passes, so a call fits every rule at the latest
// of their times.
func (r Rule) UntilRoom(entries []Entry, now int64, used, n int) int64 {
	if r.HasRoom(used, n) {
		return 0
	}
	for _, e := range entries {
		if !r.Counts(e, now) {
			continue
		}
		used -= e.Weight
		if r.HasRoom(used, n) {
			return e.At + r.Window - now
		}
	}
	return 0 // unreachable while n <= Requests, which AllowN checks
}

// Margin is the room a call must leave under r for a count that is only
// an upper bound to decide it: a tenth of the limit, rounded up. Below
// it, a Result's Remaining must be exact, so the count must be read
// exactly.
func (r Rule) Margin() int { return r.Requests/10 + min(r.Requests%10, 1) }

// AddCapped adds weights, stopping at math.MaxInt instead of wrapping
// around: a count that wrapped would admit. Past the cap a wait errs
// long, which is safe.
func AddCapped(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}
