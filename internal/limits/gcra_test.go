package limits

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

// The Count of a bucket decides as GCRA does, in exact rational time, and
// its RetryAfter is the first millisecond at which the call fits:
// property-checked on random buckets, TATs and weights, against big.Rat.
func TestBucketCountIsGCRA(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		rule := Rule{Requests: 1 + r.IntN(50), Rate: r.IntN(5000), Window: 1 + r.Int64N(10_000)}
		b := BucketOf(rule)
		now := int64(1_700_000_000_000) + r.Int64N(1000)
		tat := TAT{Ms: now - 100 + r.Int64N(b.Span()+200), Short: r.Int64N(b.Rate)}
		n := 1 + r.IntN(b.Burst)
		c := b.Count(tat, now, n)
		exact := exactTAT(b, tat)
		base := maxRat(exact, big.NewRat(now, 1))
		level := new(big.Rat).Sub(base, big.NewRat(now, 1))
		fits := new(big.Rat).Mul(level, big.NewRat(b.Rate, 1)).Cmp(big.NewRat(int64(b.Burst-n)*b.Window, 1)) <= 0
		if rule.HasRoom(c.Used, n) != fits {
			t.Fatalf("%+v at %d, TAT %+v, n %d: Used %d says fits %v, GCRA %v", b, now, tat, n, c.Used, !fits, fits)
		}
		if fits {
			want := new(big.Rat).Add(base, big.NewRat(int64(n)*b.Window, b.Rate))
			if got := b.Advance(tat, now, n); exactTAT(b, got).Cmp(want) != 0 || got.Short < 0 || got.Short >= b.Rate {
				t.Fatalf("%+v: Advance(%+v, %d, %d) = %+v, want %v ms", b, tat, now, n, got, want.FloatString(6))
			}
			continue
		}
		wait := rule.UntilRoom(c.Oldest, now, c.Used, n)
		later := b.Count(tat, now+wait, n)
		if !rule.HasRoom(later.Used, n) {
			t.Fatalf("%+v, TAT %+v, n %d: still no room %dms later (RetryAfter)", b, tat, n, wait)
		}
		if sooner := b.Count(tat, now+wait-1, n); rule.HasRoom(sooner.Used, n) {
			t.Fatalf("%+v, TAT %+v, n %d: room 1ms before RetryAfter %dms", b, tat, n, wait)
		}
	}
}

func exactTAT(b Bucket, tat TAT) *big.Rat {
	return new(big.Rat).Sub(big.NewRat(tat.Ms, 1), big.NewRat(tat.Short, b.Rate))
}

func maxRat(x, y *big.Rat) *big.Rat {
	if x.Cmp(y) >= 0 {
		return x
	}
	return y
}

// Cost is exact: whole ms rounded up, less the fraction of the last.
func TestBucketCost(t *testing.T) {
	for _, c := range []struct {
		rule Rule
		n    int
		want TAT
	}{
		{Rule{Requests: 10, Window: 1000}, 1, TAT{100, 0}},
		{Rule{Requests: 3, Window: 1000}, 1, TAT{334, 2}}, // 333 1/3 ms
		{Rule{Requests: 3, Window: 1000}, 3, TAT{1000, 0}},
		{Rule{Requests: 50, Rate: 10, Window: 1000}, 2, TAT{200, 0}},
		{Rule{Requests: 10_000, Window: 1000}, 1, TAT{1, 9000}}, // 0.1 ms
	} {
		if got := BucketOf(c.rule).Cost(c.n); got != c.want {
			t.Errorf("%+v: Cost(%d) = %+v, want %+v", c.rule, c.n, got, c.want)
		}
	}
}

// A burst of calls of weight 1 at one instant fills the bucket exactly,
// whatever the interval's fraction of a ms.
func TestBucketBurstAtOnce(t *testing.T) {
	for _, rule := range []Rule{
		{Requests: 3, Window: 1000}, {Requests: 600, Window: 1000}, {Requests: 10_000, Window: 1000},
		{Requests: 5, Rate: 7, Window: 2000}, {Requests: 2000, Rate: 1_000_000, Window: 3_600_000},
	} {
		b, now, tat, admitted := BucketOf(rule), int64(1_700_000_000_000), TAT{}, 0
		for rule.HasRoom(b.Count(tat, now, 1).Used, 1) {
			tat, admitted = b.Advance(tat, now, 1), admitted+1
		}
		if admitted != rule.Requests {
			t.Errorf("%+v: a burst admitted %d, want %d", rule, admitted, rule.Requests)
		}
	}
}

// Retreat undoes Advance exactly: a call counted then given back at the
// same ms leaves the TAT as it was, or the bucket empty if it was.
func TestBucketRetreatUndoesAdvance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		b := Bucket{Window: 1 + r.Int64N(10_000), Rate: 1 + r.Int64N(5_000), Burst: 1 + r.IntN(1000)}
		now := 1_000_000 + r.Int64N(1000)
		n := 1 + r.IntN(b.Burst)
		var tat TAT
		if r.IntN(4) > 0 {
			tat = b.Advance(TAT{}, now-r.Int64N(100), 1+r.IntN(b.Burst))
		}
		want := tat
		if tat.Empty(now) {
			want = TAT{}
		}
		if got := b.Retreat(b.Advance(tat, now, n), now, b.Giveback(n, n, 0, 0)); got != want {
			t.Fatalf("%+v: Retreat(Advance(%+v, %d, %d)) = %+v, want %+v", b, tat, now, n, got, want)
		}
	}
}

// A refund never gives back more than the bucket holds: Retreat past it
// leaves the bucket empty, not before now.
func TestBucketRetreatStopsAtEmpty(t *testing.T) {
	b := Bucket{Window: 1000, Rate: 10, Burst: 10} // 100 ms a unit
	tat := b.Advance(TAT{}, 0, 2)                  // 200
	if got := b.Retreat(tat, 150, 1000); got != (TAT{}) {
		t.Fatalf("Retreat to 100 at 150 = %+v, want empty", got)
	}
	if got := b.Retreat(tat, 50, 1000); got != (TAT{Ms: 100}) {
		t.Fatalf("Retreat of one unit = %+v, want 100", got)
	}
	if got := b.Retreat(tat, 50, 15); got != (TAT{Ms: 199, Short: 5}) {
		t.Fatalf("Retreat of 1.5 ms = %+v, want 198.5", got)
	}
}

func TestBucketGiveback(t *testing.T) {
	b := Bucket{Window: 1000, Rate: 3, Burst: 10} // 333.3 ms a unit, 1000 a unit in cost
	for _, c := range []struct {
		admitted, n    int
		given, elapsed int64
		want           int64
	}{{5, 5, 0, 0, 5000}, {5, 2, 0, 0, 2000}, {5, 5, 0, -3, 5000}, {5, 5, 0, 1, 4997}, {5, 5, 1000, 1, 3997},
		{5, 5, 0, 1667, 0}, {5, 5, 0, 1 << 62, 0}, {5, 9, 0, 0, 5000}} {
		if got := b.Giveback(c.admitted, c.n, c.given, c.elapsed); got != c.want {
			t.Errorf("Giveback(%d, %d, %d, %d) = %d, want %d", c.admitted, c.n, c.given, c.elapsed, got, c.want)
		}
	}
	if b.Units(1) != 1 || b.Units(1000) != 1 || b.Units(1001) != 2 || b.Units(0) != 0 {
		t.Error("Units does not round up")
	}
}
