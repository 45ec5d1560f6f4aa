package leakybucket

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestSortStamps: sortStamps orders a lane's intervals as a sort by stamp
// does, whether it counts their places or falls back to sorting (stamps
// off the span, repeated, or too far apart).
func TestSortStamps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		span := int64(1 + r.IntN(100))
		n := r.IntN(300)
		entries := make([]logEntry, n)
		distinct := r.Perm(2*n + 1)
		for i := range entries {
			var index int64
			switch trial % 3 {
			case 0:
				index = int64(distinct[i]) // placed by counting
			case 1:
				index = int64(r.IntN(2*n + 1)) // often repeated
			default:
				index = int64(r.IntN(4 * stampSlots)) // some beyond the slots
			}
			at := index*span + span - 1
			if trial%7 == 0 && i == 0 {
				at++ // off the span
			}
			entries[i] = logEntry{id: string(rune('a' + i%26)), at: at, weight: i}
		}
		want := slices.Clone(entries)
		slices.SortStableFunc(want, byStamp)
		sortStamps(entries, span)
		for i := range entries {
			if entries[i].at != want[i].at {
				t.Fatalf("trial %d: stamp %d is %d, want %d", trial, i, entries[i].at, want[i].at)
			}
		}
		if !slices.Equal(sortedWeights(entries), sortedWeights(want)) {
			t.Fatalf("trial %d: intervals lost or made", trial)
		}
	}
}

func sortedWeights(entries []logEntry) []int {
	var out []int
	for _, e := range entries {
		out = append(out, e.weight)
	}
	slices.Sort(out)
	return out
}
