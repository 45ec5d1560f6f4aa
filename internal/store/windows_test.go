package store

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// A call whose estimate of Redis time was still in the last fixed window
// when Redis ran its transaction in the next was added to the last one's
// interval: it is evaluated with the calls of that window, not the next's.
func TestFixedWindowCountsAtTheEstimate(t *testing.T) {
	rule := limits.Rule{PerClient: true, Requests: 3, Window: 1000}
	s := NewWindows(Plan{Rules: []limits.Rule{rule}, Longest: rule.Window}, 0).(windowsStore)
	// The estimate is 999 (window 0, which held 3 calls before this
	// one's); Redis ran it at 1000 (window 1, empty).
	h := s.newHash("h", false, 999, around)
	h.whole = true
	h.parts[0].reads[1], h.parts[0].kinds[1] = 0, readWhole
	s.readAt(h, []any{map[any]any{"0": "4"}}, func(int) int64 { return 999 })
	h.parts[0].current -= 1
	c := s.count(h, 0, rule, 999, 1000)
	if c.Used != 3 || c.Stamp != 0 {
		t.Errorf("count = used %d, stamp %d; want the 3 of window 0, stamped 0", c.Used, c.Stamp)
	}
}

// A read of a hash counts each interval with what the hash's pending
// fields add to it (written by resent take-backs and moves: see
// txn.Txn.Resend): the current one, the others in their lanes, dropped at
// no weight, added if they held none; what is not a pending weight of
// ours is skipped. So does Flush's share.
func TestReadLessPending(t *testing.T) {
	rule := limits.Rule{Requests: 100, Window: 60_000}
	s := NewWindows(Plan{Rules: []limits.Rule{rule}, Longest: rule.Window}, time.Second).(windowsStore)
	const now = 1_700_000_000_000 // interval 20 of its epoch
	fields := map[any]any{
		"18": "5", "19": "3", "20": "4", "17": "2", "t": "14",
		"p:abc.0": "18:-2,20:-1,16:4",
		"p:def.1": "19:-9,x:1,18:0,17,:3,99:-1",
	}
	h := s.newHash("h", false, now, func(int) int64 { return 0 })
	h.whole = true
	h.parts[0].reads[1], h.parts[0].kinds[1] = 0, readWhole
	s.readAt(h, []any{fields}, func(int) int64 { return now })
	want := []limits.Entry{{ID: "16", At: s.Lanes[0].At(now/1000 - 4), Weight: 4}, {ID: "17", At: s.Lanes[0].At(now/1000 - 3), Weight: 2}, {ID: "18", At: s.Lanes[0].At(now/1000 - 2), Weight: 3}}
	if p := h.parts[0]; p.current != 3 || p.totals[1] != 14 || !slices.Equal(h.lanes[0], want) {
		t.Errorf("read current %d, total %d, lane %v; want 3, 14, %v", p.current, p.totals[1], h.lanes[0], want)
	}
	wantHeld := map[string]int{"16": 4, "17": 2, "18": 3, "19": -6, "20": 3, "99": -1, "t": 14}
	if got := held(fields); !maps.Equal(got, wantHeld) {
		t.Errorf("held = %v, want %v", got, wantHeld)
	}
}
