package leakybucket

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
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

	co coalescer
}

// New returns a Bucket that applies the rules among opts (PerResource,
// PerClient), all at once, on rdb: a *redis.Client, a *redis.ClusterClient or
// a *redis.Ring. It checks the options and sends nothing to Redis.
func New(rdb redis.UniversalClient, opts ...Option) (*Bucket, error) {
	node, err := nodeOf(rdb)
	if err != nil {
		return nil, err
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := newPlan(cfg)
	st, err := cfg.strategy.newStore(p)
	if err != nil {
		return nil, err
	}
	b := &Bucket{cfg: cfg, plan: p, store: st, node: node, route: clusterRouteOf(rdb), maxN: cfg.rules[0].Limit.Requests}
	for _, r := range cfg.rules {
		b.hasClientRule = b.hasClientRule || r.Scope == ScopeClient
		b.maxN = min(b.maxN, r.Limit.Requests)
	}
	return b, nil
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

// Allow is shorthand for AllowN(ctx, resource, client, 1).
func (b *Bucket) Allow(ctx context.Context, resource, client string) (Result, error) {
	return b.AllowN(ctx, resource, client, 1)
}

// AllowN admits a request of weight n by client to resource if every rule
// has room for n more, and then records it under every rule; a denied
// request is recorded nowhere (unless WithRecordDenied). A denial is a
// Result with Allowed false, not an error. The client may be empty only if
// every rule is per-resource.
//
// Concurrent calls of one Bucket that need the same lock are coalesced: one
// leader takes the lock and decides them all in arrival order, each with
// its own Result, in one read and one write (see coalesce.go).
//
// Errors: ErrEmptyResource, ErrEmptyClient or ErrInvalidWeight for bad input
// (nothing is sent to Redis); ErrLockNotObtained if another decision held the
// lock until ctx ended or the retry strategy gave up; ErrLockExpired if the
// lock expired before the decision was written; or a Redis error, wrapped.
// With any error, nothing was recorded, except that a connection lost during
// the final write leaves it unknown whether the write was applied.
func (b *Bucket) AllowN(ctx context.Context, resource, client string, n int) (Result, error) {
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	return b.decide(resource, b.lockKey(resourceKeys(b.cfg.prefix, resource), client), &call{ctx: ctx, client: client, n: n})
}

// lockKey names the lock of client's decisions at a resource: the
// resource's when a rule is per-resource, else the (resource, client)'s.
func (b *Bucket) lockKey(keys keyspace, client string) string {
	if b.plan.clientScoped {
		return keys.clientLock(client)
	}
	return keys.resourceLock()
}

// locked runs a read-then-write for clients on one connection, under the
// lock they share: take the lock and read the counts (one round trip, more
// if a Logs SCAN needs more pages), then queue write's commands and release
// the lock in one MULTI/EXEC (one more).
func (b *Bucket) locked(ctx context.Context, resource string, clients []string, write func(redis.Pipeliner, keyspace, *tally)) error {
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return err
	}
	lockKey := b.lockKey(keys, clients[0])
	err = node.Watch(ctx, func(tx *redis.Tx) error {
		l := newLock(lockKey, b.cfg.lockTTL, b.cfg.lockRetry())
		defer l.cleanup(ctx, tx)
		r := b.store.read(keys, clients)
		if err := l.obtain(ctx, tx, func(pipe redis.Pipeliner) { r.queue(ctx, pipe) }); err != nil {
			return err
		}
		if err := r.finish(ctx, tx); err != nil {
			return err
		}
		return l.release(ctx, tx, func(pipe redis.Pipeliner) { write(pipe, keys, r.tally()) })
	})
	return wrap(b.route.redirected(err))
}

// Peek is shorthand for PeekN(ctx, resource, client, 1).
func (b *Bucket) Peek(ctx context.Context, resource, client string) (Result, error) {
	return b.PeekN(ctx, resource, client, 1)
}

// PeekN returns what AllowN would answer now, recording nothing: Remaining
// is what would be left after the call. It takes no lock, so a decision
// under way elsewhere may be missed. It costs one round trip (Logs: when
// the SCAN fits in one page).
func (b *Bucket) PeekN(ctx context.Context, resource, client string, n int) (Result, error) {
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return Result{}, err
	}
	r := b.store.read(keys, []string{client})
	if err := r.finish(ctx, b.route.conn(node, keys)); err != nil {
		return Result{}, wrap(b.route.redirected(err))
	}
	t := r.tally()
	t.sort()
	return evaluate(b.plan.rules, t, client, b.store.stamp(t.now), n, b.cfg.recordDenied), nil
}

// Flush forgets the counts of client at resource: its own, and its share of
// the resource's. It takes the lock as a decision does, and costs two round
// trips (Logs: when the SCAN fits in one page).
func (b *Bucket) Flush(ctx context.Context, resource, client string) error {
	if err := b.check(resource, client, 1); err != nil {
		return err
	}
	return b.locked(ctx, resource, []string{client}, func(pipe redis.Pipeliner, keys keyspace, t *tally) {
		b.store.forget(ctx, pipe, keys, client, t)
	})
}

// FlushAll forgets every count of resource, for all clients and rules. It
// takes no lock: the call of a decision running at the same time may
// survive. Unless the strategy is SortedSet with a per-resource rule, it
// finds the keys with SCAN, which walks the whole database.
func (b *Bucket) FlushAll(ctx context.Context, resource string) error {
	if resource == "" {
		return ErrEmptyResource
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return err
	}
	err = b.store.forgetAll(ctx, node, keys)
	if err == nil {
		err = b.route.owns(ctx, node, keys)
	}
	return wrap(b.route.redirected(err))
}

// locate names the resource's keys and finds the node that owns them.
func (b *Bucket) locate(ctx context.Context, resource string) (keyspace, *redis.Client, error) {
	keys := resourceKeys(b.cfg.prefix, resource)
	node, err := b.node(ctx, keys.slotKey())
	return keys, node, wrap(err)
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

// wrap prefixes a Redis error with the package name; the lock's errors
// already carry it.
func wrap(err error) error {
	if err == nil || errors.Is(err, ErrLockNotObtained) || errors.Is(err, ErrLockExpired) {
		return err
	}
	return fmt.Errorf("leakybucket: %w", err)
}
