package limits

import (
	"math"
	"math/bits"
)

// A Bucket is a rule as GCRA keeps it, a leaky bucket: it drains Rate
// units of weight per Window and holds at most Burst. Its whole state is a
// theoretical arrival time (TAT): when the bucket will be empty, in ms
// since the Unix epoch, the resolution of Redis's expiry, which keeps it.
// A call of weight n fits at now if the bucket, drained until now, has
// room for n: (max(tat, now) - now)*Rate <= (Burst - n)*Window; and then
// the TAT moves to max(tat, now) + Cost(n). The arithmetic is exact, in
// integers of 128 bits where a product may need them: the Redis store and
// NewLocal's buckets decide with these few lines, so that they agree to
// the millisecond.
type Bucket struct {
	Window int64 // ms
	Rate   int64
	Burst  int
}

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
func (b Bucket) Span() int64 { return b.Cost(b.Burst) }

// Cost is what a call of weight n adds to the TAT: n intervals, in ms,
// rounded up (the TAT's resolution), so that a bucket never drains
// faster than its rule says.
func (b Bucket) Cost(n int) int64 { return mulDiv(int64(n), b.Window, b.Rate, true) }

// Advance returns the TAT once a call of weight n is counted at now (ms).
func (b Bucket) Advance(tat, now int64, n int) int64 { return max(tat, now) + b.Cost(n) }

// Count is what the bucket of tat counts at now (ms) for a call of weight
// n, in the terms every strategy's Result is made of (see the root
// package's fill): Used is the weight still in the bucket, rounded up to
// a whole unit (so that Burst-Used, the Remaining, is whole units of
// room); the "newest call" leaves the "window" when the bucket is empty
// (ResetAfter), the call's stamp when it would be empty after the call,
// and the one "oldest call" of a denial, of just the weight that must
// drain for n to fit, when it has drained (RetryAfter): the first ms at
// which it fits.
func (b Bucket) Count(tat, now int64, n int) Count {
	// A TAT further ahead than any bucket holds (a burst lowered since, or a
	// value this code never wrote) is read as that far: it still denies.
	level := min(max(tat, now)-now, MaxBucketSpan)
	used := mulDiv(level, b.Rate, b.Window, true)
	c := Count{Used: int(min(used, math.MaxInt)), Stamp: now + level + min(b.Cost(n), MaxBucketSpan) - b.Window}
	if level > 0 {
		c.Newest = now + level - b.Window
	}
	if n <= b.Burst && c.Used > b.Burst-n {
		// It fits once the level is (Burst-n) intervals, rounded down to
		// the ms: the drain until then, rounded up.
		over := level - mulDiv(int64(b.Burst-n), b.Window, b.Rate, false)
		c.Oldest = []Entry{{At: now + over - b.Window, Weight: c.Used - (b.Burst - n)}}
	}
	return c
}

// mulDiv is a*b/c, rounded up if up, else down, for a, b >= 0 and c > 0,
// or math.MaxInt64 if it overflows.
func mulDiv(a, b, c int64, up bool) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, r := bits.Div64(hi, lo, uint64(c))
	if up && r > 0 {
		q++
	}
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}
