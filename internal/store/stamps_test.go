package store

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// TestSortStamps: sortStamps orders a lane's intervals as a sort by stamp
// does, whether it counts their places or falls back to sorting (stamps
// off the span, repeated, or too far apart).
func TestSortStamps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		span := int64(1 + r.IntN(100))
		n := r.IntN(300)
		entries := make([]limits.Entry, n)
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
			entries[i] = limits.Entry{ID: string(rune('a' + i%26)), At: at, Weight: i}
		}
		want := slices.Clone(entries)
		slices.SortStableFunc(want, byStamp)
		sortStamps(entries, span)
		for i := range entries {
			if entries[i].At != want[i].At {
				t.Fatalf("trial %d: stamp %d is %d, want %d", trial, i, entries[i].At, want[i].At)
			}
		}
		if !slices.Equal(sortedWeights(entries), sortedWeights(want)) {
			t.Fatalf("trial %d: intervals lost or made", trial)
		}
	}
}

func sortedWeights(entries []limits.Entry) []int {
	var out []int
	for _, e := range entries {
		out = append(out, e.Weight)
	}
	slices.Sort(out)
	return out
}
