package leakybucket

import (
	"slices"
	"testing"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// foresightPlan is a notification sender's rules: 5 per resource, 2 per
// client, per second.
func foresightPlan() plan {
	return newPlan(config{rules: []Rule{
		{Scope: ScopeResource, Limit: Per(5, 1000*ms)},
		{Scope: ScopeClient, Limit: Per(2, 1000*ms)},
	}})
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

func looks(calls []request) []bool {
	var out []bool
	for _, c := range calls {
		out = append(out, c.look)
	}
	return out
}

// A call writes only if every rule showed room for it, counting the calls
// of the batch marked to write before it; counts never seen have room.
func TestForeseeMarksCallsWithoutRoom(t *testing.T) {
	p := foresightPlan()
	var f foresight
	// Client a was seen at its limit; the resource at 3 of 5.
	f.saw(p, "r", "a", seenView(100, []int64{10, 20}, []int64{10, 20}), 1, true)
	calls := []request{{client: "a", n: 1}, {client: "b", n: 1}, {client: "b", n: 1}, {client: "b", n: 1}, {client: "c", n: 2}}
	f.foresee(p, "r", calls, 200)
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
	rule := Rule{Scope: ScopeClient, Limit: Per(3, 1000*ms)}
	s := seenCount{at: 500, used: 3, oldest: []seenCall{{at: 100, weight: 1}, {at: 400, weight: 2}}}
	for _, c := range []struct {
		now  int64
		want int
	}{{1099, 3}, {1100, 2}, {1399, 2}, {1400, 0}} {
		if got := s.usedAt(rule.model(), c.now); got != c.want {
			t.Errorf("usedAt(%d) = %d, want %d", c.now, got, c.want)
		}
	}
	partial := seenCount{used: 5, oldest: []seenCall{{at: 100, weight: 1}}}
	if got := partial.usedAt(rule.model(), 5000); got != 4 {
		t.Errorf("usedAt past the kept calls = %d, want 4: the calls not kept count still", got)
	}
}

// A flush makes what was seen of the client, and of the resource, stale;
// other clients' counts stay.
func TestForesightDrop(t *testing.T) {
	p := foresightPlan()
	var f foresight
	f.saw(p, "r", "a", seenView(100, []int64{10, 20, 30, 40, 50}, []int64{10, 20}), 1, false)
	f.saw(p, "r", "b", seenView(100, []int64{10, 20, 30, 40, 50}, []int64{30, 40}), 1, false)
	a := "a"
	f.drop("r", &a)
	calls := []request{{client: "a", n: 1}, {client: "b", n: 1}}
	f.foresee(p, "r", calls, 200)
	// a: nothing seen any more. b: its own rule was seen full.
	if got := looks(calls); !slices.Equal(got, []bool{false, true}) {
		t.Errorf("looks after Flush(a) = %v, want [false true]", got)
	}
}

// Foresight's memory is bounded: past maxForeseen counts it forgets.
func TestForesightBounded(t *testing.T) {
	p := foresightPlan()
	var f foresight
	for i := range maxForeseen {
		f.saw(p, "r", string(rune(i)), seenView(int64(i), nil, []int64{int64(i)}), 1, true)
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
