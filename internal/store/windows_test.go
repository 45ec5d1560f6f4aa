package store

import (
	"testing"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// A call whose estimate of Redis time was still in the last fixed window
// when Redis ran its transaction in the next was added to the last one's
// interval: it is judged with the calls of that window, not the next's.
func TestFixedWindowCountsAtTheEstimate(t *testing.T) {
	rule := limits.Rule{PerClient: true, Requests: 3, Window: 1000}
	y := intervals.New(0, []limits.Rule{rule})
	var h hash
	// The estimate is 999 (window 0, which held 3 calls before this
	// one's); Redis ran it at 1000 (window 1, empty).
	h.parse(y, always(999), func(yield func(string, string) bool) { yield("0", "4") }, 1)
	h.current[0] -= 1
	c := h.count(y, 0, rule, 999, 1000, 0)
	if c.Used != 3 || c.Stamp != 0 {
		t.Errorf("count = used %d, stamp %d; want the 3 of window 0, stamped 0", c.Used, c.Stamp)
	}
}
