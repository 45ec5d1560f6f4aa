package memorystore

import (
	"math"
	"testing"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// A scope whose calls waver around a steady number, here irregularly and
// by a fifth either way over about two windows, allocates nothing once its
// room fits them: neither growing it (add) nor giving it back (dropped)
// leaves the calls at the edge of the other's threshold. (Giving it back
// at a quarter full to twice the calls, and growing it twice, allocated 26
// times in 20 windows.)
func TestScopeSteadyAllocatesNothing(t *testing.T) {
	const window = 1000 // ms
	s := &scope{}
	now := int64(0)
	windows := func(n int) {
		for range n * window {
			now++
			rate := 0.2 * (1 + 0.2*math.Sin(float64(now)/300)) // calls a ms
			if math.Mod(float64(now)*rate, 1) < rate {
				s.trim(now, window)
				s.add(limits.Entry{At: now, Weight: 1}, false)
			}
		}
	}
	windows(3)
	if allocs := testing.AllocsPerRun(1, func() { windows(20) }); allocs != 0 {
		t.Errorf("%.0f allocations over 20 windows of 160-240 calls, want none", allocs)
	}
}
