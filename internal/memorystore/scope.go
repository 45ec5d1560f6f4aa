package memorystore

import (
	"cmp"
	"math"
	"slices"
	"sort"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// scope is the calls of one scope (see Counts), oldest first:
// entries[head:], the older ones trimmed. cums[i] is the weight of the
// calls up to entries[i] since the scope was made, so that what a rule
// counts is one binary search and a subtraction however many calls its
// window holds (the weights are capped at math.MaxInt, where they are
// summed again instead).
type scope struct {
	key     scopeKey
	entries []limits.Entry
	cums    []int
	base    int // the weight before entries[0]
	// total is before(len(entries)), and newest entries' last At (if
	// head < len(entries)): what a decision reads of its count's newest
	// call, kept here beside oldest rather than in the calls' room, far
	// from the head and likely out of cache.
	total  int
	newest int64
	head   int
	// oldest is entries[head].at, when head < len(entries): trim looks
	// here, not at an entry far from the newest, most likely out of cache.
	oldest  int64
	written int64 // the stamp of the newest call, ms: see shard.sweep

	prev, next *scope // in the shard's list, by written
}

// live returns the calls held, oldest first.
func (s *scope) live() []limits.Entry { return s.entries[s.head:] }

// roomFloor is the room for calls that a scope keeps however few it
// holds, so that a scope in use at a low rate, emptied and filled again
// by turns, allocates nothing.
const roomFloor = 16

// dropped follows a drop of calls (or of weight): it notes
// entries[head].at in oldest, and moves the calls held to new room
// (callRoom) when they fill under a quarter of theirs (none when they are
// none). A slice keeps the room of its longest, so without this a
// resource's scope would keep the room of a burst of a million calls as
// long as the resource is in use. Each move copies the calls held, under
// a quarter of the room, after more calls left since the room was made:
// O(1) a call.
func (s *scope) dropped() {
	live := len(s.entries) - s.head
	if cap(s.entries) > roomFloor && live*4 < cap(s.entries) {
		s.moveLive(callRoom(live))
	}
	if s.head < len(s.entries) {
		s.oldest = s.entries[s.head].At
	}
}

// callRoom is the room a scope's calls are moved to when they fill it
// (add) or fill under a quarter of it (dropped): three times their number,
// so that they may grow by half or fall by a quarter before it moves
// again. Growing to twice the room, as append does, left the calls just
// over a quarter of it, and moving them to twice their number left them
// at half: each at the edge of the other, so that a steady scope whose
// calls wavered a little allocated by turns, twice a window.
func callRoom(live int) int { return 3 * live }

// moveLive moves the calls held to the start of room for room calls: the
// scope's own room if it has that much (letting go of the client names
// of the calls trimmed), else new room.
func (s *scope) moveLive(room int) {
	s.base = s.before(s.head)
	live, cums := s.entries[s.head:], s.cums[s.head:]
	if room == cap(s.entries) {
		n := copy(s.entries, live)
		copy(s.cums, cums)
		clear(s.entries[n:])
		s.entries, s.cums = s.entries[:n], s.cums[:n]
	} else {
		s.entries = append(make([]limits.Entry, 0, room), live...)
		s.cums = append(make([]int, 0, room), cums...)
	}
	s.head = 0
}

// before is the weight of the calls before entries[i].
func (s *scope) before(i int) int {
	if i == 0 {
		return s.base
	}
	return s.cums[i-1]
}

// count is what rule counts at now, when no window is longer than
// longest: CountOf's answer. It first drops the calls that no window
// counts any more, so that a rule of the longest window counts every call
// left without a search. A nil scope holds nothing.
func (s *scope) count(rule limits.Rule, now, longest int64) limits.Count {
	if s == nil {
		return limits.Count{}
	}
	s.trim(now, longest)
	live := s.live()
	if len(live) == 0 {
		return limits.Count{}
	}
	if s.total == math.MaxInt {
		return rule.CountOf(live, now) // capped: the differences would be wrong
	}
	from := 0
	if rule.Window < longest {
		from = sort.Search(len(live), func(i int) bool { return rule.Counts(live[i], now) })
	}
	c := limits.Count{Oldest: live[from:]}
	if len(c.Oldest) > 0 {
		c.Used = s.total - s.before(s.head+from)
		c.Newest = s.newest
	}
	return c
}

// add appends e, the newest call, or adds its weight to the newest if
// merge and their stamps agree (Windows' interval). It reuses the room of
// the calls trimmed once they are at least half the entries: a scope in
// steady use allocates nothing, and moves each call at most once on
// average.
func (s *scope) add(e limits.Entry, merge bool) {
	last := len(s.entries) - 1
	if merge && last >= s.head && s.newest == e.At {
		s.entries[last].Weight = limits.AddCapped(s.entries[last].Weight, e.Weight)
		s.total = limits.AddCapped(s.total, e.Weight)
		s.cums[last] = s.total
		return
	}
	switch {
	case len(s.entries) < cap(s.entries):
	case s.head >= len(s.entries)/2:
		s.moveLive(cap(s.entries))
	default:
		s.moveLive(callRoom(len(s.entries) - s.head))
	}
	if s.head == len(s.entries) {
		s.oldest = e.At // the only call
	}
	s.total, s.newest = limits.AddCapped(s.total, e.Weight), e.At
	s.cums = append(s.cums, s.total)
	s.entries = append(s.entries, e)
}

// cap drops the oldest units of weight past limit.
func (s *scope) cap(limit int) {
	over := s.total - s.before(s.head) - limit
	for over > 0 && s.head < len(s.entries) {
		e := &s.entries[s.head]
		if e.Weight > over {
			e.Weight -= over
			// The units dropped now come before entries[head].
			if s.head == 0 {
				s.base += over
			} else {
				s.cums[s.head-1] += over
			}
			s.dropped()
			return
		}
		over -= e.Weight
		*e = limits.Entry{}
		s.head++
	}
	s.dropped()
}

// trim drops the calls that no window counts at now, whose windows are at
// most longest.
func (s *scope) trim(now, longest int64) {
	if s.head == len(s.entries) || s.oldest+longest > now {
		return
	}
	for s.head < len(s.entries) && s.entries[s.head].At+longest <= now {
		s.entries[s.head] = limits.Entry{} // let go of the client's name
		s.head++
	}
	s.dropped()
}

// takeShare takes client's calls out of s, a per-resource scope: those
// that name it or, under Windows (merged), mine's weight in each interval.
func (s *scope) takeShare(client string, mine *scope, merged bool) {
	live := s.live()
	if merged && mine != nil {
		for _, e := range mine.live() {
			if i, ok := slices.BinarySearchFunc(live, e.At, func(x limits.Entry, at int64) int { return cmp.Compare(x.At, at) }); ok {
				live[i].Weight -= e.Weight
			}
		}
	}
	live = slices.DeleteFunc(live, func(e limits.Entry) bool { return e.Weight <= 0 || !merged && e.Client == client })
	s.entries, s.cums = s.entries[:s.head+len(live)], s.cums[:s.head+len(live)]
	for i := s.head; i < len(s.entries); i++ {
		s.cums[i] = limits.AddCapped(s.before(i), s.entries[i].Weight)
	}
	s.total = s.before(len(s.entries))
	if len(live) > 0 {
		s.newest = live[len(live)-1].At
	}
	s.dropped()
}
