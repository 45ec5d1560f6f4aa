package stall

import (
	"testing"
	"time"
)

// TestDuringSumsTheStallsItOverlaps: every stall within the span counts,
// each only for the part of it inside the span, and a wake within the
// timer's slack counts as none.
func TestDuringSumsTheStallsItOverlaps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	m := &Meter{wakes: []wake{
		{due: at(1), woke: at(1.5)}, // the timer's slack: no stall
		{due: at(3), woke: at(8)},   // 5 ms
		{due: at(9), woke: at(12)},  // 3 ms
		{due: at(20), woke: at(30)}, // 10 ms, half of it inside [0, 25]
		{due: at(40), woke: at(50)}, // outside
	}}
	for _, c := range []struct {
		from, to float64
		want     time.Duration
	}{
		{0, 25, 13 * time.Millisecond},
		{0, 2, 0},
		{4, 10, 5 * time.Millisecond},
		{31, 39, 0},
	} {
		if got := m.During(at(c.from), at(c.to)); got != c.want {
			t.Errorf("During(%v ms, %v ms) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}
