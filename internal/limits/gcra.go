package limits

import "math"

// A Bucket is a rule as GCRA keeps it, a leaky bucket: it drains one unit
// of weight per Interval and holds at most Burst. Its whole state is a
// theoretical arrival time (TAT): when the bucket will be empty, in ms
// since the Unix epoch, the resolution of Redis's expiry, which keeps it. A
// call of weight n fits at now if the bucket, drained until now, has room
// for n: max(tat, now) + n*Interval - now <= Burst*Interval; and then
// the TAT moves to max(tat, now) + Cost(n). The Redis store and NewLocal's
// buckets decide with these few lines, so that they agree to the
// millisecond.
type Bucket struct {
	Interval int64 // ns per unit of weight
	Burst    int
	window   int64 // the rule's Window, ms: what the Count is expressed in
}

// nsPerMs converts between ns and the ms of TATs and Counts.
const nsPerMs = 1_000_000

// MaxBucketSpan bounds Burst*Interval (ns), the most a bucket holds in
// time, so that no sum of a level and the weight of a call overflows:
// about 73 years.
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
func (b Bucket) Span() int64 { return b.weight(b.Burst) }

// Cost is what a call of weight n adds to the TAT: n intervals, rounded
// up to the ms (the TAT's resolution), so that a bucket never drains
// faster than its rule says.
func (b Bucket) Cost(n int) int64 { return ceilMs(min(b.weight(n), MaxBucketSpan)) }

// Advance returns the TAT once a call of weight n is counted at now (ms).
func (b Bucket) Advance(tat, now int64, n int) int64 { return max(tat, now) + b.Cost(n) }

// Count is what the bucket of tat counts at now (ms) for a call of weight
// n, in the terms every strategy's Result is made of (see the root
// package's fill): Used is the weight still in the bucket, rounded up to
// a whole unit (so that Burst-Used, the Remaining, is whole units of
// room); the "newest call" leaves the "window" when the bucket is empty
// (ResetAfter), the call's stamp when it would be empty after the call,
// and the one "oldest call" of a denial, of just the weight that must
// drain for n to fit, when it has drained (RetryAfter), rounded up to the
// ms: never sooner than the bucket says.
func (b Bucket) Count(tat, now int64, n int) Count {
	// A TAT further ahead than any bucket holds (a burst lowered since, or a
	// value this code never wrote) is read as that far: it still denies.
	level := min(max(tat, now)-now, MaxBucketSpan/nsPerMs)
	c := Count{Used: b.units(level * nsPerMs), Stamp: now + level + b.Cost(n) - b.window}
	if level > 0 {
		c.Newest = now + level - b.window
	}
	over := level*nsPerMs + min(b.weight(n), MaxBucketSpan) - b.Span()
	if over > 0 && c.Used > 0 {
		c.Oldest = []Entry{{At: now + ceilMs(over) - b.window, Weight: c.Used - (b.Burst - n)}}
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

// units is level (ns) in whole units of weight, rounded up, at most MaxInt.
func (b Bucket) units(level int64) int {
	u := (level + b.Interval - 1) / b.Interval
	if u > math.MaxInt {
		return math.MaxInt
	}
	return int(u)
}

// ceilMs is ns rounded up to ms.
func ceilMs(ns int64) int64 { return (ns + nsPerMs - 1) / nsPerMs }
