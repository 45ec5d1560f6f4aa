package limits

import "math"

// A Bucket is a rule as GCRA keeps it, a leaky bucket: it drains one unit
// of weight per Interval and holds at most Burst. Its whole state is a
// theoretical arrival time (TAT): when the bucket will be empty, in ns
// since the Unix epoch. A call of weight n fits at now if the bucket,
// drained until now, has room for n: max(tat, now) + n*Interval - now <=
// Burst*Interval. Both the Redis store and NewLocal's counts decide with
// these few lines, so that they agree to the nanosecond.
type Bucket struct {
	Interval int64 // ns per unit of weight
	Burst    int
	window   int64 // the rule's Window, ms: what the Count is expressed in
}

// nsPerMs converts between the ns of a TAT and the ms of a Count.
const nsPerMs = 1_000_000

// MaxBucketSpan bounds Burst*Interval, the most a bucket holds in time, so
// that no sum of a TAT and the weight of a call overflows: about 146 years.
const MaxBucketSpan = math.MaxInt64 / 4

// BucketOf returns r's bucket: r.Requests is its burst, and it drains
// r.Rate (r.Requests if 0) per r.Window. The interval is rounded up to the
// nanosecond, so that the bucket never drains faster than the rule says.
func BucketOf(r Rule) Bucket {
	rate := int64(r.Rate)
	if rate == 0 {
		rate = int64(r.Requests)
	}
	w := r.Window * nsPerMs
	return Bucket{Interval: (w + rate - 1) / rate, Burst: r.Requests, window: r.Window}
}

// Span is Burst*Interval, or more than MaxBucketSpan if it overflows.
func (b Bucket) Span() int64 {
	if b.Interval > 0 && int64(b.Burst) > MaxBucketSpan/b.Interval {
		return math.MaxInt64
	}
	return int64(b.Burst) * b.Interval
}

// Advance returns the TAT once a call of weight n is counted from from:
// the bucket as it was, drained no further than from, plus the call.
func (b Bucket) Advance(tat, from int64, n int) int64 {
	return max(tat, from) + int64(n)*b.Interval
}

// Count is what the bucket of tat counts at now (ns) for a call of weight
// n <= Burst, in the terms every strategy's Result is made of (see the
// root package's fill), with nowMs, now in ms rounded down, as the View's
// Now: Used is the weight still in the bucket, rounded up to a whole unit
// (so that Burst-Used, the Remaining, is whole units of room); the
// "newest call" leaves the "window" when the bucket is empty (ResetAfter),
// the call's stamp when it would be empty after the call, and the one
// "oldest call" of a denial, of just the weight that must drain for n to
// fit, when it has drained (RetryAfter). Every duration is rounded up to
// the ms: never sooner than the bucket says.
func (b Bucket) Count(tat, now, nowMs int64, n int) Count {
	// A TAT further ahead than any bucket holds (a burst lowered since, or a
	// value this code never wrote) is read as that far: it still denies.
	level := min(max(tat, now)-now, MaxBucketSpan)
	weight := min(b.weight(n), MaxBucketSpan)
	c := Count{Used: b.units(level), Stamp: nowMs + ceilMs(level+weight) - b.window}
	if level > 0 {
		c.Newest = nowMs + ceilMs(level) - b.window
	}
	if over := level + weight - b.Span(); over > 0 && c.Used > 0 {
		c.Oldest = []Entry{{At: nowMs + ceilMs(over) - b.window, Weight: c.Used - (b.Burst - n)}}
	}
	return c
}

// weight is n units of weight in ns, or more than MaxBucketSpan if that
// overflows.
func (b Bucket) weight(n int) int64 {
	if int64(n) > MaxBucketSpan/b.Interval {
		return math.MaxInt64
	}
	return int64(n) * b.Interval
}

// units is level in whole units of weight, rounded up, at most MaxInt.
func (b Bucket) units(level int64) int {
	u := (level + b.Interval - 1) / b.Interval
	if u > math.MaxInt {
		return math.MaxInt
	}
	return int(u)
}

// ceilMs is ns rounded up to ms.
func ceilMs(ns int64) int64 { return (ns + nsPerMs - 1) / nsPerMs }
