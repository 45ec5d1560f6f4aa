package store

import (
	"testing"

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
