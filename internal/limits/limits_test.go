package limits

import (
	"math"
	"testing"
)

// A rule counts an entry until its stamp is a whole window old, and
// CountOf counts exactly the tail of entries it still counts.
func TestCountOf(t *testing.T) {
	r := Rule{Requests: 3, Window: 1000}
	entries := []Entry{{At: 100, Weight: 1}, {At: 400, Weight: 2}, {At: 900, Weight: 1}}
	for _, c := range []struct {
		now          int64
		used, oldest int
		newest       int64
	}{{1099, 4, 3, 900}, {1100, 3, 2, 900}, {1400, 1, 1, 900}, {1900, 0, 0, 0}} {
		got := r.CountOf(entries, c.now)
		if got.Used != c.used || len(got.Oldest) != c.oldest || got.Newest != c.newest {
			t.Errorf("CountOf at %d = used %d, %d entries, newest %d; want %d, %d, %d",
				c.now, got.Used, len(got.Oldest), got.Newest, c.used, c.oldest, c.newest)
		}
	}
}

// UntilRoom waits for just enough of the oldest entries to leave.
func TestUntilRoom(t *testing.T) {
	r := Rule{Requests: 3, Window: 1000}
	entries := []Entry{{At: 100, Weight: 1}, {At: 400, Weight: 1}, {At: 900, Weight: 1}}
	for _, c := range []struct {
		n    int
		want int64
	}{{1, 100}, {2, 400}, {3, 900}} {
		if got := r.UntilRoom(entries, 1000, 3, c.n); got != c.want {
			t.Errorf("UntilRoom(n=%d) = %d, want %d", c.n, got, c.want)
		}
	}
	if got := r.UntilRoom(entries, 1000, 2, 1); got != 0 {
		t.Errorf("UntilRoom with room = %d, want 0", got)
	}
	// An entry that left already is no room to wait for.
	if got := r.UntilRoom(entries, 1150, 3, 1); got != 250 {
		t.Errorf("UntilRoom past the first entry = %d, want 250 (the second's)", got)
	}
}

// Weights never wrap around: a count that wrapped would admit.
func TestAddCapped(t *testing.T) {
	if got := AddCapped(math.MaxInt-1, 2); got != math.MaxInt {
		t.Errorf("AddCapped(MaxInt-1, 2) = %d, want MaxInt", got)
	}
	r := Rule{Requests: math.MaxInt, Window: 1}
	if r.HasRoom(AddCapped(math.MaxInt, math.MaxInt), 1) {
		t.Error("a capped count has room")
	}
	if !r.HasRoom(math.MaxInt-1, 1) || r.HasRoom(math.MaxInt-1, 2) {
		t.Error("HasRoom at MaxInt: want room for exactly 1")
	}
}

// A call AtMost is judged at the least room of its rules, up to N, and at
// 1 when a rule has none (or less than none: a limit lowered below its
// count); any other call at N, whatever the room.
func TestCallWeight(t *testing.T) {
	rules := []Rule{{Requests: 10}, {Requests: 4, PerClient: true}}
	for _, c := range []struct {
		n, usedTotal, usedClient int
		atMost                   bool
		want                     int
	}{
		{3, 0, 0, true, 3},  // fits all
		{10, 0, 0, true, 4}, // the client's rule has the least room
		{10, 8, 0, true, 2}, // the total's
		{3, 10, 0, true, 1}, // none: judged as one unit, a denial
		{3, 12, 0, true, 1}, // less than none
		{3, 0, 4, true, 1},  // the client's is full
		{7, 9, 3, false, 7}, // all or nothing
		{math.MaxInt, 0, 0, true, 4},
	} {
		counts := []Count{{Used: c.usedTotal}, {Used: c.usedClient}}
		got := Call{N: c.n, AtMost: c.atMost}.Weight(rules, counts)
		if got != c.want {
			t.Errorf("Call{N: %d, AtMost: %v}.Weight(used %d, %d) = %d, want %d", c.n, c.atMost, c.usedTotal, c.usedClient, got, c.want)
		}
	}
}
