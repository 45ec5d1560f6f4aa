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
	// Rate is what GCRA drains per Window, Requests being then the burst
	// (see Bucket); 0: Requests.
	Rate int
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
	// Bound is at least Used: what a read of fewer fields shows of the
	// count (under Windows, the totals of the epochs a window reaches),
	// for foresight to foresee such a read; 0 where there is none.
	Bound int
	// Bounded: Used is Bound, not the count, which was not read (a call
	// sent Far). A call it admits is one the count admits, with no more
	// Remaining; Oldest is empty and Newest at least the newest counted's.
	// See View.Undecided.
	Bounded bool
}

// A Call is one call to decide, of weight N by Client.
type Call struct {
	Client string
	N      int
	// Look: the call writes nothing, and is only judged (foresight saw
	// no room for it): a store must neither record it nor take it back.
	Look bool
	// Far: every rule showed room for the call and a margin beside it
	// (package foresight). A store may then leave out the reads that only
	// a denial's Result needs, and say so (View.Short).
	Far bool
	// AtMost: the call asks for as much of N as every rule has room for
	// (AllowAtMost), not all of N or nothing. A store writes N as it
	// would, and records only Weight of it: its room is known only once
	// the counts are read, in the same decision.
	AtMost bool
}

// Weight is the weight call c is judged and recorded at, given counts, what
// each of rules counted before it: N; or, AtMost, the least room of the
// rules, up to N, the same in every rule (all or nothing across them), and
// 1 if some rule has no room at all, so that the call is a denial whose
// RetryAfter is until one unit fits. It reads only each count's Used,
// which every store reads whatever the weight.
func (c Call) Weight(rules []Rule, counts []Count) int {
	if !c.AtMost {
		return c.N
	}
	w := c.N
	for r, rule := range rules {
		w = min(w, rule.Requests-counts[r].Used)
	}
	return max(w, 1)
}

// A View is what was read for one call.
type View struct {
	Now    int64   // Redis time, ms
	Counts []Count // by rule, in the order of the rules
	// Short: the store left out what only a denial needs (the oldest
	// calls, for RetryAfter) for a call sent Far. If these counts deny
	// the call, it is not recorded, and is decided again on a full read.
	Short bool
}

// Undecided reports whether v leaves a call of weight n to be decided
// again, on a full read, without being recorded: denied where some count
// was read too little for a denial's Result (Short, or Bounded); or with
// a Bounded count that leaves less than its rule's Margin beside the
// call, where the count itself may deny it, or leave less Remaining than
// the bound may stand for.
func (v View) Undecided(rules []Rule, n int) bool {
	bounded, denied := false, false
	for r, rule := range rules {
		c := v.Counts[r]
		if c.Bounded && !rule.HasRoom(AddCapped(c.Used, rule.Margin()), n) {
			return true
		}
		bounded = bounded || c.Bounded
		denied = denied || !rule.HasRoom(c.Used, n)
	}
	return denied && (v.Short || bounded)
}

// Fits reports whether every rule has room for n beside what v counts.
func (v View) Fits(rules []Rule, n int) bool {
	for r, rule := range rules {
		if !rule.HasRoom(v.Counts[r].Used, n) {
			return false
		}
	}
	return true
}

// Margin is the room a rule must show beside a call for the call to be
// far from its limit: a tenth of its Requests, at least 1. A call sent Far
// (package foresight) and decided on a Bounded count is one with at least
// this much room left beside it, so that its Remaining, a bound, is exact
// wherever the exact one is less than this.
func (r Rule) Margin() int { return max(r.Requests/10, 1) }

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
	return 0 // unreachable while n <= Requests: a heavier call is never asked (the Bucket answers Never)
}

// AddCapped adds weights, stopping at math.MaxInt instead of wrapping
// around: a count that wrapped would admit. Past the cap a wait errs
// long, which is safe.
func AddCapped(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}
