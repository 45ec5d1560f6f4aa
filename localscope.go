package leakybucket

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// scope is the calls of one scope of a local Bucket (see localCounts),
// oldest first: entries[head:], the older ones trimmed. cums[i] is the
// weight of the calls up to entries[i] since the scope was made, so that
// what a rule counts is one binary search and a subtraction however many
// calls its window holds (the weights are capped at math.MaxInt, where
// they are summed again instead).
type scope struct {
	key     scopeKey
	entries []logEntry
	cums    []int
	base    int // the weight before entries[0]
	head    int
	// oldest is entries[head].at, when head < len(entries): trim looks
	// here, not at an entry far from the newest, most likely out of cache.
	oldest  int64
	written int64 // the stamp of the newest call, ms: see localShard.sweep

	prev, next *scope // in the shard's list, by written
}

// live returns the calls held, oldest first.
func (s *scope) live() []logEntry { return s.entries[s.head:] }

// headMoved notes entries[head].at in oldest.
func (s *scope) headMoved() {
	if s.head < len(s.entries) {
		s.oldest = s.entries[s.head].at
	}
}

// before is the weight of the calls before entries[i].
func (s *scope) before(i int) int {
	if i == 0 {
		return s.base
	}
	return s.cums[i-1]
}

// count is what rule counts at now, when no window is longer than
// longest: countOf's answer. It first drops the calls that no window
// counts any more, so that a rule of the longest window counts every call
// left without a search. A nil scope holds nothing.
func (s *scope) count(rule Rule, now, longest int64) count {
	if s == nil {
		return count{}
	}
	s.trim(now, longest)
	live := s.live()
	if len(live) == 0 {
		return count{}
	}
	if s.cums[len(s.cums)-1] == math.MaxInt {
		return countOf(rule, live, now) // capped: the differences would be wrong
	}
	from := 0
	if rule.Limit.windowMillis() < longest {
		from = sort.Search(len(live), func(i int) bool { return counts(rule, live[i], now) })
	}
	c := count{oldest: live[from:]}
	if len(c.oldest) > 0 {
		c.used = s.cums[len(s.cums)-1] - s.before(s.head+from)
		c.newest = live[len(live)-1].at
	}
	return c
}

// add appends e, the newest call, or adds its weight to the newest if
// merge and their stamps agree (Windows' interval). It reuses the room of
// the calls trimmed once they are at least half the entries: a scope in
// steady use allocates nothing, and moves each call at most once on
// average.
func (s *scope) add(e logEntry, merge bool) {
	last := len(s.entries) - 1
	if merge && last >= s.head && s.entries[last].at == e.at {
		s.entries[last].weight = addCapped(s.entries[last].weight, e.weight)
		s.cums[last] = addCapped(s.cums[last], e.weight)
		return
	}
	if len(s.entries) == cap(s.entries) && s.head >= len(s.entries)/2 {
		s.base = s.before(s.head)
		n := copy(s.entries, s.entries[s.head:])
		copy(s.cums, s.cums[s.head:])
		clear(s.entries[n:])
		s.entries, s.cums, s.head = s.entries[:n], s.cums[:n], 0
	}
	if s.head == len(s.entries) {
		s.oldest = e.at // the only call
	}
	s.cums = append(s.cums, addCapped(s.before(len(s.entries)), e.weight))
	s.entries = append(s.entries, e)
}

// cap drops the oldest units of weight past limit.
func (s *scope) cap(limit int) {
	over := s.cums[len(s.cums)-1] - s.before(s.head) - limit
	for over > 0 && s.head < len(s.entries) {
		e := &s.entries[s.head]
		if e.weight > over {
			e.weight -= over
			// The units dropped now come before entries[head].
			if s.head == 0 {
				s.base += over
			} else {
				s.cums[s.head-1] += over
			}
			s.headMoved()
			return
		}
		over -= e.weight
		*e = logEntry{}
		s.head++
	}
	s.headMoved()
}

// trim drops the calls that no window counts at now, whose windows are at
// most longest.
func (s *scope) trim(now, longest int64) {
	if s.head == len(s.entries) || s.oldest+longest > now {
		return
	}
	for s.head < len(s.entries) && s.entries[s.head].at+longest <= now {
		s.entries[s.head] = logEntry{} // let go of the client's name
		s.head++
	}
	s.headMoved()
}

// takeShare takes client's calls out of s, a per-resource scope: those
// that name it or, under Windows (merged), mine's weight in each interval.
func (s *scope) takeShare(client string, mine *scope, merged bool) {
	live := s.live()
	if merged && mine != nil {
		for _, e := range mine.live() {
			if i, ok := slices.BinarySearchFunc(live, e.at, func(x logEntry, at int64) int { return cmp.Compare(x.at, at) }); ok {
				live[i].weight -= e.weight
			}
		}
	}
	live = slices.DeleteFunc(live, func(e logEntry) bool { return e.weight <= 0 || !merged && e.client == client })
	s.entries, s.cums = s.entries[:s.head+len(live)], s.cums[:s.head+len(live)]
	for i := s.head; i < len(s.entries); i++ {
		s.cums[i] = addCapped(s.before(i), s.entries[i].weight)
	}
	s.headMoved()
}
