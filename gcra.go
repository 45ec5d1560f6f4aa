package leakybucket

import (
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/store"
)

// GCRA is a leaky bucket, kept as the generic cell rate algorithm (GCRA)
// keeps one, as go-redis/redis_rate and throttled do, but without a
// script: each rule is a bucket that drains at Requests per Window and
// holds at most a burst of weight (Limit.WithBurst; by default Requests),
// and a call is admitted if every rule's bucket has room for its weight,
// which it then fills. Per(100, time.Minute) thus admits 100 at once
// from an empty bucket, then one every 600ms: a smooth rate, not a
// sliding window's 100 in any minute (a sliding window lets a quiet
// minute's 100 through in its first second, and then nothing).
//
// The state of a rule and scope (the resource, or each (resource,
// client)) is one number in Redis, the bucket's theoretical arrival time
// (TAT, in Redis's clock, exact: intervals need not be whole ms): the
// expiry of a key, and the fraction of a ms in its value, which Redis
// drops once the bucket is empty, the least memory of the strategies. A
// batch of calls is decided by compare-and-swap in two round trips
// (WATCH, PEXPIRETIME and GET of the buckets, TIME; then MULTI, a SET of
// each changed bucket, EXEC), so that each call is counted at the time
// Redis ran its write: docs/strategies.md says why that admits only what
// GCRA admits, and the one bound, for rules faster than one unit per
// millisecond. A batch whose calls are all denied writes nothing.
// PEXPIRETIME needs Redis 7.0 or later.
//
// Every field of a Result is exact, in whole units of weight and
// milliseconds rounded up: Used is the weight in the bucket, Remaining the
// room left, RetryAfter when the call fits (Never above the burst), and
// ResetAfter when the bucket is empty. One bound, in Redis only and for
// rules faster than one unit per millisecond: just after a call costing
// under a millisecond filled an empty bucket, its TAT is read rounded up
// to the millisecond, so the fields may count up to a millisecond of
// drain more than the bucket holds (docs/strategies.md). GCRA refuses WithRecordDenied,
// WithReplicas, WithLockTTL and WithLockWait, and a Limit with a
// Precision, with an error matching ErrInvalidOption. Flush empties a
// client's own buckets: a per-resource bucket keeps no client's share, so
// a Bucket without a per-client rule refuses it (errors.ErrUnsupported).
var GCRA Strategy = gcraStrategy{}

type gcraStrategy struct{}

func (gcraStrategy) String() string { return "gcra" }

func (st gcraStrategy) newStore(p plan) (store.Store, error) {
	if err := st.check(p); err != nil {
		return nil, err
	}
	return store.NewGCRA(p.Plan), nil
}

func (st gcraStrategy) counting(p plan) (counting, error) {
	return counting{tats: true}, st.check(p)
}

// check returns an ErrInvalidOption error if GCRA cannot keep p's rules,
// or is given an option that means nothing to it.
func (st gcraStrategy) check(p plan) error {
	if err := exact(st, p); err != nil {
		return err
	}
	switch {
	case p.RecordDenied:
		return invalidStrategy(st, "WithRecordDenied: a bucket fills with admitted weight only")
	case p.replicas > 0:
		return invalidStrategy(st, "WithReplicas: a TAT written cannot be taken back once others read it")
	case p.locking != (store.Locking{TTL: defaultLockTTL, Wait: defaultConfig().lockWait}):
		return invalidStrategy(st, "WithLockTTL and WithLockWait: it takes no lock")
	}
	for i, r := range p.Rules {
		if limits.BucketOf(r).Span() > limits.MaxBucketSpan {
			return invalidStrategy(st, "rule %v: its burst drains in more than %v ms", p.public[i], limits.MaxBucketSpan)
		}
	}
	return nil
}
