package foresight

import (
	"slices"
	"testing"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// newSender is the foresight of a notification sender's rules: 5 per
// resource, 2 per client, per second.
func newSender() *Foresight {
	return New([]limits.Rule{{Requests: 5, Window: 1000}, {PerClient: true, Requests: 2, Window: 1000}}, 1000)
}

// seenView is what a transaction read at now: used and the oldest stamps
// of each rule, one unit each.
func seenView(now int64, resource, client []int64) limits.View {
	entries := func(stamps []int64) []limits.Entry {
		var out []limits.Entry
		for _, at := range stamps {
			out = append(out, limits.Entry{At: at, Weight: 1})
		}
		return out
	}
	return limits.View{Now: now, Counts: []limits.Count{
		{Used: len(resource), Oldest: entries(resource), Stamp: now},
		{Used: len(client), Oldest: entries(client), Stamp: now},
	}}
}

func looks(calls []limits.Call) []bool {
	var out []bool
	for _, c := range calls {
		out = append(out, c.Look)
	}
	return out
}

// A call writes only if every rule showed room for it, counting the calls
// of the batch marked to write before it; counts never seen have room.
func TestForeseeMarksCallsWithoutRoom(t *testing.T) {
	f := newSender()
	// Client a was seen at its limit; the resource at 3 of 5.
	f.Saw("r", "a", seenView(100, []int64{10, 20}, []int64{10, 20}), 1, true)
	calls := []limits.Call{{Client: "a", N: 1}, {Client: "b", N: 1}, {Client: "b", N: 1}, {Client: "b", N: 1}, {Client: "c", N: 2}}
	f.Foresee("r", calls, 200)
	// a: its own rule full. b, b: room (resource 3 -> 5). b again: b's
	// rule full. c: the resource full by then.
	want := []bool{true, false, false, true, true}
	if got := looks(calls); !slices.Equal(got, want) {
		t.Errorf("looks = %v, want %v", got, want)
	}
}

// What was seen moves on: calls that have left their window since count
// no more, and a count whose kept calls have all left stays as full as it
// was beyond them.
func TestSeenCountMovesOn(t *testing.T) {
	rule := limits.Rule{PerClient: true, Requests: 3, Window: 1000}
	s := seenCount{at: 500, used: 3, oldest: []seenCall{{at: 100, weight: 1}, {at: 400, weight: 2}}}
	for _, c := range []struct {
		now  int64
		want int
	}{{1099, 3}, {1100, 2}, {1399, 2}, {1400, 0}} {
		if got := s.usedAt(rule, c.now); got != c.want {
			t.Errorf("usedAt(%d) = %d, want %d", c.now, got, c.want)
		}
	}
	partial := seenCount{used: 5, oldest: []seenCall{{at: 100, weight: 1}}}
	if got := partial.usedAt(rule, 5000); got != 4 {
		t.Errorf("usedAt past the kept calls = %d, want 4: the calls not kept count still", got)
	}
}

// A flush makes what was seen of the client, and of the resource, stale;
// other clients' counts stay.
func TestForesightDrop(t *testing.T) {
	f := newSender()
	f.Saw("r", "a", seenView(100, []int64{10, 20, 30, 40, 50}, []int64{10, 20}), 1, false)
	f.Saw("r", "b", seenView(100, []int64{10, 20, 30, 40, 50}, []int64{30, 40}), 1, false)
	a := "a"
	f.Drop("r", &a)
	calls := []limits.Call{{Client: "a", N: 1}, {Client: "b", N: 1}}
	f.Foresee("r", calls, 200)
	// a: nothing seen any more. b: its own rule was seen full.
	if got := looks(calls); !slices.Equal(got, []bool{false, true}) {
		t.Errorf("looks after Flush(a) = %v, want [false true]", got)
	}
}

// Foresight's memory is bounded: past maxForeseen counts it forgets.
func TestForesightBounded(t *testing.T) {
	f := newSender()
	for i := range maxForeseen {
		f.Saw("r", string(rune(i)), seenView(int64(i), nil, []int64{int64(i)}), 1, true)
	}
	if len(f.seen) > maxForeseen {
		t.Fatalf("%d counts kept, want at most %d", len(f.seen), maxForeseen)
	}
	for _, s := range f.seen {
		if len(s.oldest) > seenEntries {
			t.Fatalf("%d calls kept of one count, want at most %d", len(s.oldest), seenEntries)
		}
	}
}
