package leakybucket

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/store"
)

// A Bucket limits requests to resources by the rules it was made with,
// across every process that uses the same Redis and prefix. Make one with
// New; it is safe for concurrent use.
type Bucket struct {
	cfg    config
	plan   plan
	counts backend
}

// A backend keeps a Bucket's counts and decides its calls: in Redis
// (remote, made by New) or in this process's memory (local, made by
// NewLocal). The Bucket checks the input; the backend does the rest.
type backend interface {
	// allow decides a call of weight n, as how asks, and writes its
	// Result into res.
	allow(ctx context.Context, resource, client string, n int, how ask, res *Result) error
	// refund gives back up to n of a's weight (see Bucket.Refund).
	refund(ctx context.Context, a *Admission, n int) (int, error)
	// generation reads resource's generation, which every Flush and
	// FlushAll changes (see Bucket.Refund).
	generation(ctx context.Context, resource string) (string, error)
	// read returns what every rule counts for a call of weight n,
	// writing nothing, by ctx's deadline.
	read(ctx context.Context, resource, client string, n int) (reading, error)
	// flush forgets client's counts at resource, and its share of the
	// resource's.
	flush(ctx context.Context, resource, client string) error
	// flushAll forgets every count of resource.
	flushAll(ctx context.Context, resource string) error
	// finalError is what a call at resource that ended with err returns: on
	// Redis, the breaker's say (breaker.go).
	finalError(ctx context.Context, resource string, err error) error
}

// An ask is how a backend decides a call, beyond its weight.
type ask struct {
	// atMost: as much of n as every rule has room for (AllowAtMost).
	atMost bool
	// at, if not nil, is set to the time (ms, the counts' clock) that an
	// admitted call's decision read, no later than its weight started to
	// count: what Refund counts its drain from.
	at *int64
}

// A reading is what every rule counts for a call, and the plan that
// judges it: the Bucket's, or while its fallback decides, the fallback's
// (see WithFallback).
type reading struct {
	limits.View
	plan *plan
}

// New returns a Bucket that applies the rules among opts (PerResource,
// PerClient), all at once, on rdb: a *redis.Client, a *redis.ClusterClient or
// a *redis.Ring. It checks the options and sends nothing to Redis.
func New(rdb redis.UniversalClient, opts ...Option) (*Bucket, error) {
	node, err := nodeOf(rdb)
	if err != nil {
		return nil, err
	}
	cfg, p, err := configure(opts)
	if err != nil {
		return nil, err
	}
	st, err := cfg.strategy.newStore(p)
	if err != nil {
		return nil, err
	}
	b := newBucket(cfg, p)
	r := newRemote(cfg, p, st, node, store.RouteOf(rdb))
	b.counts = r
	if cfg.fallback {
		if b.counts, err = newFallback(cfg, r); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// configure applies and checks opts.
func configure(opts []Option) (config, plan, error) {
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return cfg, plan{}, err
	}
	return cfg, newPlan(cfg), nil
}

// newBucket returns a Bucket of cfg's rules, with no counts yet: New
// keeps them in Redis, NewLocal in memory.
func newBucket(cfg config, p plan) *Bucket {
	return &Bucket{cfg: cfg, plan: p}
}
