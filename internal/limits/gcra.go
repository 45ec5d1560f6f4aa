package limits

import (
	"math"
	"math/bits"
)

// A Bucket is a rule as GCRA keeps it, a leaky bucket: it drains Rate
// units of weight per Window and holds at most Burst. Its whole state is a
// theoretical arrival time (TAT), when the bucket will be empty. A call
// of weight n fits at now if the bucket, drained until now, has room for
// n: (max(tat, now) - now)*Rate <= (Burst - n)*Window; and then the TAT
// moves to max(tat, now) + n*Window/Rate. The arithmetic is exact, in
// integers of 128 bits where a product may need them: the Redis store and
// NewLocal's buckets decide with these few lines, so that they agree.
type Bucket struct {
	Window int64 // ms
	Rate   int64
	Burst  int
}

// A TAT is a theoretical arrival time, exact: Ms less Short/Rate of a
// millisecond (since the Unix epoch), Short in [0, Rate) as Advance makes
// it. A cost of n is n*Window/Rate ms, whose fraction a TAT kept to the
// millisecond would have to round: up, and a rule of 3 per second would
// admit 2 of its burst of 3; down, and it would admit more than GCRA.
type TAT struct{ Ms, Short int64 }

// MaxBucketSpan bounds the time a full bucket takes to drain, Burst
// intervals, in ms: about 292 000 years, so that no TAT overflows.
const MaxBucketSpan = math.MaxInt64 / 1024

// BucketOf returns r's bucket: r.Requests is its burst, and it drains
// r.Rate (r.Requests if 0) per r.Window.
func BucketOf(r Rule) Bucket {
	rate := int64(r.Rate)
	if rate == 0 {
		rate = int64(r.Requests)
	}
	return Bucket{Window: r.Window, Rate: rate, Burst: r.Requests}
}

// Span is how long a full bucket takes to drain, in ms rounded up; more
// than MaxBucketSpan if that overflows.
func (b Bucket) Span() int64 { return b.Cost(b.Burst).Ms }

// Cost is what a call of weight n adds to a TAT, n intervals: as a TAT,
// Ms whole milliseconds (rounded up) less Short/Rate.
func (b Bucket) Cost(n int) TAT { return b.Advance(TAT{}, 0, n) }

// Empty reports whether the bucket of tat is empty at now (ms).
func (tat TAT) Empty(now int64) bool { return tat.Ms <= now }

// Advance returns the TAT once a call of weight n is counted at now (ms):
// max(tat, now) + n intervals.
func (b Bucket) Advance(tat TAT, now int64, n int) TAT {
	if tat.Empty(now) {
		tat = TAT{Ms: now}
	}
	hi, lo := bits.Mul64(uint64(n), uint64(b.Window))
	if hi == 0 && lo <= uint64(tat.Short) {
		return TAT{Ms: tat.Ms, Short: tat.Short - int64(lo)}
	}
	// n*Window - Short, then whole ms rounded up and what is left below.
	lo, borrow := bits.Sub64(lo, uint64(tat.Short), 0)
	hi -= borrow
	if hi >= uint64(b.Rate) {
		return TAT{Ms: math.MaxInt64}
	}
	q, r := bits.Div64(hi, lo, uint64(b.Rate))
	short := int64(0)
	if r > 0 {
		q, short = q+1, b.Rate-int64(r)
	}
	if q > uint64(math.MaxInt64-tat.Ms) {
		return TAT{Ms: math.MaxInt64}
	}
	return TAT{Ms: tat.Ms + int64(q), Short: short}
}

// level is what the bucket of tat holds at now, in 1/Rate of a ms (weight
// times Window): 0 if it is empty.
func (b Bucket) level(tat TAT, now int64) u128 {
	if tat.Empty(now) {
		return u128{}
	}
	hi, lo := bits.Mul64(uint64(min(tat.Ms-now, MaxBucketSpan)), uint64(b.Rate))
	lo, borrow := bits.Sub64(lo, uint64(tat.Short), 0)
	return u128{hi - borrow, lo}
}

// Count is what the bucket of tat counts at now (ms) for a call of weight
// n, in the terms every strategy's Result is made of (see the root
// package's fill): Used is the weight still in the bucket, rounded up to
// a whole unit (so that Burst-Used, the Remaining, is whole units of
// room); the "newest call" leaves the "window" when the bucket is empty
// (ResetAfter), the call's stamp when it would be empty after the call,
// and the one "oldest call" of a denial, of just the weight that must
// drain for n to fit, when it has drained (RetryAfter): the first ms at
// which it fits.
func (b Bucket) Count(tat TAT, now int64, n int) Count {
	level := b.level(tat, now)
	after := b.Advance(tat, now, n)
	c := Count{Used: int(min(level.div(b.Window, true), math.MaxInt)), Stamp: min(after.Ms, now+MaxBucketSpan) - b.Window}
	if !tat.Empty(now) {
		c.Newest = min(tat.Ms, now+MaxBucketSpan) - b.Window
	}
	if n <= b.Burst && c.Used > b.Burst-n {
		// It fits once the level is down to (Burst-n)*Window: the drain
		// until then, rounded up to the ms.
		room := mul(int64(b.Burst-n), b.Window)
		over := level.sub(room).div(b.Rate, true)
		c.Oldest = []Entry{{At: now + over - b.Window, Weight: c.Used - (b.Burst - n)}}
	}
	return c
}

// u128 is an unsigned integer of 128 bits, for the products of a level.
type u128 struct{ hi, lo uint64 }

func mul(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

// sub is x-y, for x >= y.
func (x u128) sub(y u128) u128 {
	lo, borrow := bits.Sub64(x.lo, y.lo, 0)
	return u128{x.hi - y.hi - borrow, lo}
}

// div is x/c, rounded up if up, else down, for c > 0, or math.MaxInt64
// if it overflows.
func (x u128) div(c int64, up bool) int64 {
	if x.hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(x.hi, x.lo, uint64(c))
	if up && r > 0 {
		q++
	}
	return int64(min(q, math.MaxInt64))
}

// Giveback is what a refund of up to n units may give back of a call of
// weight admitted, decided elapsed ms ago, of which given was given back
// already: the cost of n units, or what the call may still hold if less,
// in 1/Rate of a ms (a unit costs Window). A call's weight drains only
// once the bucket's older weight has, and elapsed counts from no later
// than the call started to count, so the call holds at least this much:
// a refund of it never gives back room the call's weight had drained
// from. It saturates at math.MaxInt64.
func (b Bucket) Giveback(admitted, n int, given, elapsed int64) int64 {
	held := sat(mul(int64(admitted), b.Window)) - given
	if elapsed > 0 {
		held -= sat(mul(min(elapsed, MaxBucketSpan), b.Rate))
	}
	return max(min(held, sat(mul(int64(n), b.Window))), 0)
}

// Units is cost (in 1/Rate of a ms) in units of weight, rounded up.
func (b Bucket) Units(cost int64) int { return int(min(mul(cost, 1).div(b.Window, true), math.MaxInt)) }

// Retreat returns tat moved back by cost (in 1/Rate of a ms, see
// Giveback), as if that much had never been counted, and empty if that
// leaves nothing in the bucket at now (ms): never before now, so that it
// gives back no more than the bucket holds.
func (b Bucket) Retreat(tat TAT, now int64, cost int64) TAT {
	back := TAT{Ms: tat.Ms - cost/b.Rate, Short: tat.Short + cost%b.Rate}
	if back.Short >= b.Rate {
		// Ms - Short/Rate with Short in [0, Rate): a ms more back.
		back = TAT{Ms: back.Ms - 1, Short: back.Short - b.Rate}
	}
	if tat.Empty(now) || back.Empty(now) {
		return TAT{}
	}
	return back
}

// sat is x, or math.MaxInt64 if it does not fit.
func sat(x u128) int64 {
	if x.hi != 0 || x.lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(x.lo)
}

// Givebacks is Giveback under each of the buckets of a call, by rule,
// given (the cost given back before) by rule; and the weight that gives
// back, the most units under any rule.
func Givebacks(buckets []Bucket, admitted, n int, given []int64, elapsed int64) ([]int64, int) {
	out, weight := make([]int64, len(buckets)), 0
	for r, b := range buckets {
		out[r] = b.Giveback(admitted, n, given[r], elapsed)
		weight = max(weight, b.Units(out[r]))
	}
	return out, weight
}
