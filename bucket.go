package leakybucket

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/lock"
)

// A Bucket limits requests to resources by the rules it was made with,
// across every process that uses the same Redis and prefix. Make one with
// New; it is safe for concurrent use.
type Bucket struct {
	cfg   config
	plan  plan
	store store
	node  func(ctx context.Context, key string) (*redis.Client, error)
	route *clusterRoute // nil unless a *redis.ClusterClient: see cluster.go

	hasClientRule bool
	maxN          int // the smallest Requests of the rules

	keyPrefix string // the prefix and the tag of the strategy's key layout
	clocks    clock.Set
	batches   batcher
	denials   denials
	foresight foresight
	breakers  breakers // see breaker.go

	local *localCounts // non-nil for NewLocal: then none of the above is used
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
	b.store, b.node, b.route = st, node, clusterRouteOf(rdb)
	b.keyPrefix = cfg.prefix + ":" + st.tag()
	b.batches.run, b.batches.workers = b.decideBatch, 1
	if _, locked := st.(logsStore); !locked {
		b.batches.workers = lockFreeWorkers
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
	b := &Bucket{cfg: cfg, plan: p, hasClientRule: p.hasClientRule, maxN: cfg.rules[0].Limit.Requests}
	for _, r := range cfg.rules {
		b.maxN = min(b.maxN, r.Limit.Requests)
	}
	return b
}

// nodeOf returns how to find the client of the node that owns a key.
func nodeOf(rdb redis.UniversalClient) (func(context.Context, string) (*redis.Client, error), error) {
	switch c := rdb.(type) {
	case *redis.Client:
		if c != nil {
			return func(context.Context, string) (*redis.Client, error) { return c, nil }, nil
		}
	case *redis.ClusterClient:
		if c != nil {
			return c.MasterForKey, nil
		}
	case *redis.Ring:
		if c != nil {
			return func(_ context.Context, key string) (*redis.Client, error) { return c.GetShardClientForKey(key) }, nil
		}
	}
	return nil, ErrUnsupportedClient
}

// lockFreeWorkers is how many batches of one resource a Bucket has under
// way at once under SortedSet and Windows: a second transaction in flight
// keeps Redis busy while the reply of the first travels. More make the
// batches smaller, and cost Redis more than they save (measured with 2, 4
// and 8 in bench/).
const lockFreeWorkers = 2

// siteOf returns where resource's counts live.
func (b *Bucket) siteOf(ctx context.Context, resource string, view *lock.View) (site, error) {
	ks := b.keysOf(resource)
	node, err := b.node(ctx, ks.Slot())
	if err != nil {
		return site{}, classify(err)
	}
	if err := b.admit(node); err != nil {
		return site{}, err // the breaker is open: see breaker.go
	}
	refind := func(ctx context.Context) (*redis.Client, error) { return b.node(ctx, ks.Slot()) }
	return site{node: node, keys: ks, clock: b.clocks.Of(node.Options().Addr), route: b.route, lock: view, refind: refind}, nil
}

// keysOf names the keys of resource.
func (b *Bucket) keysOf(resource string) keys.Space {
	return keys.Of(b.keyPrefix, resource)
}

// check refuses bad input before anything is sent.
func (b *Bucket) check(resource, client string, n int) error {
	switch {
	case resource == "":
		return ErrEmptyResource
	case client == "" && b.hasClientRule:
		return ErrEmptyClient
	case n <= 0:
		return fmt.Errorf("%w: n = %d, want at least 1", ErrInvalidWeight, n)
	case n > b.maxN:
		return fmt.Errorf("%w: n = %d exceeds the %d requests of a rule, so it could never be admitted", ErrInvalidWeight, n, b.maxN)
	}
	return nil
}
