package memorystore

import (
	"math"
	"sort"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// call is one call a scope holds (under a layout, one interval's calls).
// It holds no pointer, so that the garbage collector never scans the
// calls, most of a busy Bucket's memory, and is 24 bytes, not the 48 of
// a limits.Entry: a decision reads and writes fewer cache lines, most of
// them cold with many keys in use. A Count's Oldest are made from the
// calls only when a Result reads them (see shard.readOldest).
type call struct {
	at     int64 // its stamp, ms (see limits.Entry.At)
	weight int
	// sum is the weight of the calls up to this one since the scope was
	// made, so that what a rule counts is one binary search and a
	// subtraction however many calls its window holds (the weights are
	// capped at math.MaxInt, where they are summed again instead).
	sum int
}

// scope is the calls of one scope (see Counts), oldest first: calls[head:],
// the older ones trimmed. Its fields are in the order a decision reads
// them, those it reads first (the key, its calls) in the first 64 bytes,
// the others it reads in the next 64, so that it touches two cache lines
// of a scope, not three (a scope takes 192 bytes, its size class, so it
// starts on a line); what only a sweep, a Flush or a new scope reads is
// last.
type scope struct {
	key   scopeKey
	calls []call
	head  int
	// oldest is calls[head].at, when head < len(calls): trim looks here,
	// not at a call far from the newest, most likely out of cache.
	oldest int64
	// total is before(len(calls)), and newest calls' last at (if head <
	// len(calls)): what a decision reads of its count's newest call, kept
	// here beside oldest rather than in the calls' room, far from the
	// head and likely out of cache.
	total   int
	newest  int64
	written int64 // the stamp of the newest call, ms: see shard.sweep
	// gone is the weight of the calls before calls[head], before(head):
	// what a rule of the longest window counts is total less gone, read
	// here, not in the calls, where the sum before the head is likely out
	// of cache.
	gone  int
	named bool
	// clients name the client of each call, by its index in calls, in a
	// per-resource scope outside a layout (named), for Flush; nil in the
	// others, whose calls are their client's or merged.
	clients    []string
	hash       uint64 // key's, in its shard's scopeMap
	same       *scope // the next scope of the same hash (see scopeMap)
	listed     int64  // the time the scope is in its shard's list by: see shard.sweep
	prev, next *scope // in the shard's list, by listed
}

// live returns the calls held, oldest first.
func (s *scope) live() []call { return s.calls[s.head:] }

// roomFloor is the room for calls that a scope keeps however few it
// holds, so that a scope in use at a low rate, emptied and filled again
// by turns, allocates nothing.
const roomFloor = 16

// dropped follows a drop of calls (or of weight): it notes calls[head].at
// in oldest, and moves the calls held to new room (callRoom) when they
// fill under a quarter of theirs (none when they are none). A slice keeps
// the room of its longest, so without this a resource's scope would keep
// the room of a burst of a million calls as long as the resource is in
// use. Each move copies the calls held, under a quarter of the room, after
// more calls left since the room was made: O(1) a call.
func (s *scope) dropped() {
	live := len(s.calls) - s.head
	if cap(s.calls) > roomFloor && live*4 < cap(s.calls) {
		s.moveLive(callRoom(live))
	}
	if s.head < len(s.calls) {
		s.oldest = s.calls[s.head].at
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
	if room == cap(s.calls) {
		s.calls = s.calls[:copy(s.calls, s.live())]
	} else {
		s.calls = append(make([]call, 0, room), s.live()...)
	}
	if s.named {
		s.clients = moveNames(s.clients, s.head, room)
	}
	s.head = 0
}

// moveNames is moveLive for a named scope's clients: those from head on,
// moved to the start of room for room names.
func moveNames(clients []string, head, room int) []string {
	if room != cap(clients) {
		return append(make([]string, 0, room), clients[head:]...)
	}
	n := copy(clients, clients[head:])
	clear(clients[n:])
	return clients[:n]
}

// before is the weight of the calls before calls[i], a call held (or
// one past the newest).
func (s *scope) before(i int) int {
	if i == s.head {
		return s.gone
	}
	return s.calls[i-1].sum
}

// count is what rule counts at now, when no window is longer than
// longest, but its Oldest, and from which of the live calls on: CountOf's
// answer, whose Oldest are live()[from:]. It first drops the calls that no
// window counts any more, so that a rule of the longest window counts
// every call left without a search. A nil scope holds nothing.
func (s *scope) count(rule limits.Rule, now, longest int64) (c limits.Count, from int) {
	if s == nil {
		return limits.Count{}, 0
	}
	s.trim(now, longest)
	live := s.live()
	if len(live) == 0 {
		return limits.Count{}, 0
	}
	if rule.Window < longest {
		from = sort.Search(len(live), func(i int) bool { return live[i].at+rule.Window > now })
	}
	if from == len(live) {
		return limits.Count{}, from
	}
	c.Newest = s.newest
	if s.total < math.MaxInt {
		c.Used = s.total - s.before(s.head+from)
		return c, from
	}
	for _, e := range live[from:] { // capped: the differences would be wrong
		c.Used = limits.AddCapped(c.Used, e.weight)
	}
	return c, from
}

// add appends e, the newest call, or adds its weight to the newest if
// merge and their stamps agree (Windows' interval). It reuses the room of
// the calls trimmed once they are at least half the calls: a scope in
// steady use allocates nothing, and moves each call at most once on
// average. A named scope keeps e's client.
func (s *scope) add(e limits.Entry, merge bool) {
	last := len(s.calls) - 1
	if merge && last >= s.head && s.newest == e.At {
		c := &s.calls[last]
		c.weight = limits.AddCapped(c.weight, e.Weight)
		s.total = limits.AddCapped(s.total, e.Weight)
		c.sum = s.total
		return
	}
	switch {
	case len(s.calls) < cap(s.calls):
	case s.head >= len(s.calls)/2:
		s.moveLive(cap(s.calls))
	default:
		s.moveLive(callRoom(len(s.calls) - s.head))
	}
	if s.head == len(s.calls) {
		s.oldest = e.At // the only call
	}
	s.total, s.newest = limits.AddCapped(s.total, e.Weight), e.At
	s.calls = append(s.calls, call{at: e.At, weight: e.Weight, sum: s.total})
	if s.named {
		s.clients = append(s.clients, e.Client)
	}
}

// cap drops the oldest units of weight past limit.
func (s *scope) cap(limit int) {
	over := s.total - s.before(s.head) - limit
	for over > 0 && s.head < len(s.calls) {
		c := &s.calls[s.head]
		if c.weight > over {
			c.weight -= over
			s.gone += over // the units dropped now come before calls[head]
			s.dropped()
			return
		}
		over -= c.weight
		s.forgetHead()
	}
	s.dropped()
}

// forgetHead drops calls[head], and lets go of its client's name.
func (s *scope) forgetHead() {
	if s.named {
		s.clients[s.head] = ""
	}
	s.gone = s.calls[s.head].sum
	s.head++
}

// trim drops the calls that no window counts at now, whose windows are at
// most longest.
func (s *scope) trim(now, longest int64) {
	if s.head == len(s.calls) || s.oldest+longest > now {
		return
	}
	for s.head < len(s.calls) && s.calls[s.head].at+longest <= now {
		s.forgetHead()
	}
	s.dropped()
}

// takeShare takes client's calls out of s, a per-resource scope: those
// that name it or, under Windows (merged), mine's weight in each interval.
func (s *scope) takeShare(client string, mine *scope, merged bool) {
	if merged && mine != nil {
		s.takeWeights(mine)
	}
	kept := s.head
	for i := s.head; i < len(s.calls); i++ {
		if s.calls[i].weight <= 0 || s.named && s.clients[i] == client {
			continue
		}
		s.calls[kept] = s.calls[i]
		s.calls[kept].sum = limits.AddCapped(s.before(kept), s.calls[i].weight)
		if s.named {
			s.clients[kept] = s.clients[i]
		}
		kept++
	}
	if s.named {
		clear(s.clients[kept:])
		s.clients = s.clients[:kept]
	}
	s.calls = s.calls[:kept]
	s.total = s.before(kept)
	if kept > s.head {
		s.newest = s.calls[kept-1].at
	}
	s.dropped()
}

// takeWeights takes the weight of each of mine's intervals out of s's
// interval of the same stamp, leaving the sums for takeShare to set.
func (s *scope) takeWeights(mine *scope) {
	live := s.live()
	for _, c := range mine.live() {
		if i := sort.Search(len(live), func(i int) bool { return live[i].at >= c.at }); i < len(live) && live[i].at == c.at {
			live[i].weight -= c.weight
		}
	}
}

// counted returns the live calls from from on: those a count holds, as
// count found them. None in a nil scope.
func (s *scope) counted(from int) []call {
	if s == nil {
		return nil
	}
	return s.live()[from:]
}

// entries appends calls to dst, as a Count's Oldest holds them.
func entries(dst []limits.Entry, calls []call) []limits.Entry {
	for _, c := range calls {
		dst = append(dst, limits.Entry{At: c.at, Weight: c.weight})
	}
	return dst
}
