package main

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// A limiter decides one call of (resource, client): admitted or not. An
// error may come with allowed true when the admission was written but
// something after it failed (the naive baseline's Release).
type limiter interface {
	Allow(ctx context.Context, resource, client string) (allowed bool, err error)
}

// strategies are this library's entries, one per strategy: adding one is a
// line here.
var strategies = []struct {
	name string
	opts []leakybucket.Option
	// bucket: a leaky bucket (GCRA), bound as redis_rate is, and without
	// WithReplicas, which it refuses.
	bucket bool
}{
	{logsName, nil, false}, // the default strategy
	{sortedSetName, []leakybucket.Option{leakybucket.WithStrategy(leakybucket.SortedSet)}, false},
	{windowsName, []leakybucket.Option{leakybucket.WithStrategy(leakybucket.Windows(windowsPrecision))}, false},
	{gcraName, []leakybucket.Option{leakybucket.WithStrategy(leakybucket.GCRA)}, true},
}

// strategyBound is the bound of a strategy's rows: a sliding window's, or
// GCRA's for the leaky bucket.
func strategyBound(bucket bool) func(limit int, window, elapsed time.Duration) int64 {
	if bucket {
		return gcraBound
	}
	return windowBound
}

// Names of this library's rows, which the report's prose refers to.
const (
	logsName         = "leakybucket Logs"
	sortedSetName    = "leakybucket SortedSet"
	windowsName      = "leakybucket Windows(50ms)"
	gcraName         = "leakybucket GCRA"
	windowsPrecision = 50 * time.Millisecond
)

// An impl is one implementation under test.
type impl struct {
	name string
	// ours: a strategy of this library.
	ours bool
	// scripting: it runs Lua, on the peers' server; else on the library's,
	// which denies scripting.
	scripting bool
	// bound is the most admissions one key may get in elapsed time under a
	// limit of limit calls per window; nil for the floor, which limits
	// nothing.
	bound func(limit int, window, elapsed time.Duration) int64
	// exact: with no errors, a key asked n times in less than one window
	// gets exactly min(n, limit) admissions.
	exact bool
	// overAdmits, if set, says why this peer may admit past its bound: a
	// race of its design, which its rows report as found, without failing
	// the run (a failure is for a limiter that claims to hold its bound).
	overAdmits string
	make       func(rdb *redis.Client, limit int, window time.Duration) (limiter, error)
}

// windowBound: in any span of length elapsed, a sliding window of
// limit per window admits at most limit per started window.
func windowBound(limit int, window, elapsed time.Duration) int64 {
	return int64(limit) * (int64(elapsed/window) + 1)
}

// implName is its name, for -impl.
func (im impl) implName() string { return im.name }

// gcraBound: redis_rate's GCRA with burst = rate = limit per period admits
// the burst at once and then one call every period/limit, so in a span of
// length elapsed at most limit + elapsed*limit/period (+1 for rounding).
func gcraBound(limit int, window, elapsed time.Duration) int64 {
	return int64(limit) + int64(float64(limit)*elapsed.Seconds()/window.Seconds()) + 1
}

// spanTarget is the target of what one span may hold, for strategy name
// under limit per window: a sliding window's limit, or a leaky bucket's
// burst and what drains in the span (the rows' check says which).
func spanTarget(name string, limit int, window string) string {
	if name == gcraName {
		return fmt.Sprintf("never more than the burst, %d, and what drains in any span", limit)
	}
	return fmt.Sprintf("never more than %d in any %s", limit, window)
}

// Names of the implementations that the ratios refer to.
const (
	redisRateName = "redis_rate (Lua GCRA)"
	ululeName     = "ulule/limiter (Lua fixed window)"
	floorName     = "floor: 1 pipelined SET"
	naiveName     = "naive: redislock + SCAN"
)

func implementations() []impl {
	var all []impl
	for _, s := range strategies {
		opts := s.opts
		all = append(all, impl{
			name: s.name, ours: true, bound: strategyBound(s.bucket), exact: !s.bucket,
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				b, err := newBucket(rdb, limit, window, opts...)
				if err != nil {
					return nil, err
				}
				return libLimiter{b}, nil
			},
		})
	}
	all = append(all,
		impl{
			name: redisRateName, scripting: true, bound: gcraBound,
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				return rateLimiter{redis_rate.NewLimiter(rdb), redis_rate.Limit{Rate: limit, Burst: limit, Period: window}}, nil
			},
		},
		impl{
			name: ululeName, scripting: true, bound: windowBound, exact: true,
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				store, err := ululeredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "ulule"})
				if err != nil {
					return nil, err
				}
				return ululeLimiter{ulule.New(store, ulule.Rate{Period: window, Limit: int64(limit)})}, nil
			},
		},
	)
	all = append(all, noLuaPeers()...)
	return append(all,
		impl{
			name: naiveName, scripting: true, bound: windowBound, exact: true,
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				return newNaive(rdb, limit, window), nil
			},
		},
		impl{
			name: floorName,
			make: func(rdb *redis.Client, _ int, window time.Duration) (limiter, error) {
				return floor{rdb, window}, nil
			},
		},
	)
}

// newBucket is this library's limiter as every table uses it: one rule,
// per client, with the default lock options.
func newBucket(rdb *redis.Client, limit int, window time.Duration, opts ...leakybucket.Option) (*leakybucket.Bucket, error) {
	return leakybucket.New(rdb, append([]leakybucket.Option{
		leakybucket.WithPrefix("lb"),
		leakybucket.PerClient(leakybucket.Per(limit, window)),
	}, opts...)...)
}

// A weightedLimiter also decides calls of weight n, all or nothing.
type weightedLimiter interface {
	AllowN(ctx context.Context, resource, client string, n int) (allowed bool, err error)
}

type libLimiter struct{ b *leakybucket.Bucket }

func (l libLimiter) Allow(ctx context.Context, resource, client string) (bool, error) {
	return l.AllowN(ctx, resource, client, 1)
}

func (l libLimiter) AllowN(ctx context.Context, resource, client string, n int) (bool, error) {
	res, err := l.b.AllowN(ctx, resource, client, n)
	return res.Allowed, err
}

type rateLimiter struct {
	l     *redis_rate.Limiter
	limit redis_rate.Limit
}

func (r rateLimiter) Allow(ctx context.Context, resource, client string) (bool, error) {
	return r.AllowN(ctx, resource, client, 1)
}

func (r rateLimiter) AllowN(ctx context.Context, resource, client string, n int) (bool, error) {
	res, err := r.l.AllowN(ctx, resource+":"+client, r.limit, n)
	if err != nil {
		return false, err
	}
	return res.Allowed > 0, nil
}

// ululeLimiter is ulule/limiter's Redis store: a fixed window, one counter
// per key that INCRBY raises and the first call of the window sets to
// expire after it, in one EVALSHA. Get counts the call and says whether it
// passed the limit.
type ululeLimiter struct{ l *ulule.Limiter }

func (u ululeLimiter) Allow(ctx context.Context, resource, client string) (bool, error) {
	return u.AllowN(ctx, resource, client, 1)
}

// AllowN counts n (Get is Increment of 1); a call past the limit is
// counted too, as ulule's fixed window counts every attempt.
func (u ululeLimiter) AllowN(ctx context.Context, resource, client string, n int) (bool, error) {
	res, err := u.l.Increment(ctx, resource+":"+client, int64(n))
	if err != nil {
		return false, err
	}
	return !res.Reached, nil
}

// floor is the least a decision can cost: one round trip carrying one
// write, sent as a pipeline as the library sends its commands. It admits
// everything.
type floor struct {
	rdb    *redis.Client
	window time.Duration
}

func (f floor) Allow(ctx context.Context, resource, client string) (bool, error) {
	_, err := f.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "floor:"+resource+":"+client, "", f.window)
		return nil
	})
	return err == nil, err
}

// overAdmitted is the check and the verdict of a row where im admitted
// more than its bound: what was found, and whether it fails the run.
func (im impl) overAdmitted(found string) (check string, violation bool) {
	if im.overAdmits != "" {
		return "past its bound, as its design allows (" + im.overAdmits + "): " + found, false
	}
	return "OVER-ADMITTED: " + found, true
}
