package limits

import (
	"math/rand/v2"
	"testing"
)

// The Count of a bucket decides as GCRA does, and its RetryAfter is the
// first millisecond at which the call fits: property-checked on random
// buckets, TATs and weights.
func TestBucketCountIsGCRA(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		rule := Rule{Requests: 1 + r.IntN(50), Rate: r.IntN(50), Window: 1 + r.Int64N(10_000)}
		b := BucketOf(rule)
		now := int64(1_700_000_000_000) + r.Int64N(1000)
		tat := now - 100 + r.Int64N(b.Span()+200)
		n := 1 + r.IntN(b.Burst)
		c := b.Count(tat, now, n)
		fits := (max(tat, now)-now)*b.Rate <= int64(b.Burst-n)*b.Window
		if rule.HasRoom(c.Used, n) != fits {
			t.Fatalf("%+v at %d, TAT %d, n %d: Used %d says fits %v, GCRA %v", b, now, tat, n, c.Used, !fits, fits)
		}
		if fits {
			if got := b.Advance(tat, now, n); got != max(tat, now)+b.Cost(n) {
				t.Fatalf("Advance = %d", got)
			}
			continue
		}
		wait := rule.UntilRoom(c.Oldest, now, c.Used, n)
		later := b.Count(tat, now+wait, n)
		if !rule.HasRoom(later.Used, n) {
			t.Fatalf("%+v, TAT %d, n %d: still no room %dms later (RetryAfter)", b, tat-now, n, wait)
		}
		if sooner := b.Count(tat, now+wait-1, n); rule.HasRoom(sooner.Used, n) {
			t.Fatalf("%+v, TAT %d, n %d: room 1ms before RetryAfter %dms", b, tat-now, n, wait)
		}
	}
}

// Cost rounds up to the ms, so that a bucket never drains faster than
// its rule.
func TestBucketCost(t *testing.T) {
	for _, c := range []struct {
		rule Rule
		n    int
		want int64
	}{
		{Rule{Requests: 10, Window: 1000}, 1, 100},
		{Rule{Requests: 3, Window: 1000}, 1, 334},
		{Rule{Requests: 3, Window: 1000}, 3, 1000},
		{Rule{Requests: 50, Rate: 10, Window: 1000}, 2, 200},
	} {
		if got := BucketOf(c.rule).Cost(c.n); got != c.want {
			t.Errorf("%+v: Cost(%d) = %d, want %d", c.rule, c.n, got, c.want)
		}
	}
}
