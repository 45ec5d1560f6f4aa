package leakybucket

import (
	"context"
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

	keyPrefix string // the prefix and the tag of the strategy's key layout
	clocks    clocks
	co        coalescer
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
	b.keyPrefix = cfg.prefix + ":" + st.tag()
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
// Concurrent calls of one Bucket that need the same lock are coalesced: a
// worker takes the lock and decides them all in arrival order, each with
// its own Result, in one read and one write (see coalesce.go). AllowN
// returns by ctx's deadline whatever Redis does; what it left under way
// (the batch, the release of a lock) finishes in the background.
//
// Errors, to match with errors.Is: ErrEmptyResource, ErrEmptyClient or
// ErrInvalidWeight for bad input (nothing is sent to Redis);
// ErrLockNotObtained if another holder held the lock until ctx ended or the
// retry strategy gave up; ErrUnavailable, with its cause, if Redis could
// not be reached; ErrLockExpired if the lock expired before the decision
// was written; ctx's error if it ended while Redis was slow to answer; or
// a Redis error, wrapped. With any error nothing was recorded, except that
// a call whose final write was under way when the error came may have been
// counted (never admitted uncounted).
func (b *Bucket) AllowN(ctx context.Context, resource, client string, n int) (res Result, err error) {
	defer b.observe(ctx, b.observed(), OpAllow, resource, client, n, &res, &err)
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	return b.decide(resource, b.lockKey(b.keysOf(resource), client), &call{ctx: ctx, client: client, n: n})
}

// lockKey names the lock of client's decisions at a resource: the
// resource's when a rule is per-resource, else the (resource, client)'s.
func (b *Bucket) lockKey(keys keyspace, client string) string {
	if b.plan.clientScoped {
		return keys.clientLock(client)
	}
	return keys.resourceLock()
}

// keysOf names the keys of resource.
func (b *Bucket) keysOf(resource string) keyspace {
	return resourceKeys(b.keyPrefix, resource)
}

// locked runs a read-then-write under the lock lockKey, on one connection
// of the node that owns keys: take the lock and queue r's reads (one round
// trip, more if a Logs SCAN needs more pages), then queue write's commands
// and release the lock in one MULTI/EXEC (one more). view keeps what was
// learned of the lock. ctx bounds the wait
// for the lock; once a SET is sent, the round trips are bounded by the
// lock's deadline instead.
func (b *Bucket) locked(ctx context.Context, keys keyspace, lockKey string, r reader, view *lockView, write func(redis.Pipeliner, *tally)) error {
	node, err := b.node(ctx, keys.slotKey())
	if err != nil {
		return classify(err)
	}
	err = node.Watch(ctx, func(tx *redis.Tx) error {
		l := newLock(lockKey, b.cfg.lockTTL, b.cfg.lockRetry(), node, b.clocks.of(node.Options().Addr), view)
		defer l.cleanup(ctx, tx)
		if err := l.obtain(ctx, tx, func(pipe redis.Pipeliner) { r.queue(ctx, pipe) }); err != nil {
			return err
		}
		// Callers who give up from here on end nothing: the decision
		// completes and releases the lock at once (see lock.holding).
		hold, cancel := l.holding(ctx)
		defer cancel()
		if err := r.finish(hold, tx); err != nil {
			return err
		}
		return l.release(hold, tx, func(pipe redis.Pipeliner) { write(pipe, r.tally()) })
	})
	return classify(b.route.redirected(err))
}

// Peek is shorthand for PeekN(ctx, resource, client, 1).
func (b *Bucket) Peek(ctx context.Context, resource, client string) (Result, error) {
	return b.PeekN(ctx, resource, client, 1)
}

// PeekN returns what AllowN would answer now, recording nothing: Remaining
// is what would be left after the call. It takes no lock, so a decision
// under way elsewhere may be missed. It costs one round trip (Logs: when
// the SCAN fits in one page).
func (b *Bucket) PeekN(ctx context.Context, resource, client string, n int) (res Result, err error) {
	defer b.observe(ctx, b.observed(), OpPeek, resource, client, n, &res, &err)
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	return bounded(ctx, func(ctx context.Context, _ *lockView) (Result, error) {
		keys := b.keysOf(resource)
		node, err := b.node(ctx, keys.slotKey())
		if err != nil {
			return Result{}, classify(err)
		}
		r := b.store.read(keys, []string{client})
		if err := r.finish(ctx, b.route.conn(node, keys)); err != nil {
			return Result{}, classify(b.route.redirected(err))
		}
		t := r.tally()
		t.sort()
		return evaluate(b.plan.rules, t, client, b.store.stamp(t.now), n, b.cfg.recordDenied), nil
	})
}

// Flush forgets the counts of client at resource: its own, and its share of
// the resource's. It takes the lock as a decision does, and costs two round
// trips (Logs: when the SCAN fits in one page).
func (b *Bucket) Flush(ctx context.Context, resource, client string) (err error) {
	defer b.observe(ctx, b.observed(), OpFlush, resource, client, 0, nil, &err)
	if err := b.check(resource, client, 1); err != nil {
		return err
	}
	_, err = bounded(ctx, func(ctx context.Context, view *lockView) (struct{}, error) {
		keys := b.keysOf(resource)
		return struct{}{}, b.locked(ctx, keys, b.lockKey(keys, client), b.store.read(keys, []string{client}), view, func(pipe redis.Pipeliner, t *tally) {
			b.store.forget(ctx, pipe, keys, client, t)
		})
	})
	return err
}

// FlushAll forgets every count of resource, for all clients and rules. When
// a rule is per-resource it takes the resource's lock, as a decision does,
// so that it never races a decision or a Flush: their writes happen wholly
// before or wholly after it. When every rule is per-client there is no
// lock to take: a decision running at the same time may be counted after
// the flush. Unless the strategy is SortedSet with a per-resource rule, it
// finds the keys with SCAN, which walks the whole database.
func (b *Bucket) FlushAll(ctx context.Context, resource string) (err error) {
	defer b.observe(ctx, b.observed(), OpFlushAll, resource, "", 0, nil, &err)
	if resource == "" {
		return ErrEmptyResource
	}
	_, err = bounded(ctx, func(ctx context.Context, view *lockView) (struct{}, error) {
		keys := b.keysOf(resource)
		if b.plan.clientScoped {
			return struct{}{}, b.flushUnlocked(ctx, keys)
		}
		r := b.store.readAll(keys)
		return struct{}{}, b.locked(ctx, keys, keys.resourceLock(), r, view, func(pipe redis.Pipeliner, _ *tally) {
			if found := r.keys(); len(found) > 0 {
				pipe.Del(ctx, found...)
			}
		})
	})
	return err
}

// flushUnlocked deletes every key of the resource's counts, found with SCAN.
func (b *Bucket) flushUnlocked(ctx context.Context, keys keyspace) error {
	node, err := b.node(ctx, keys.slotKey())
	if err != nil {
		return classify(err)
	}
	err = deleteKeys(ctx, node, b.store.countsPrefix(keys), b.cfg.scanCount)
	if err == nil {
		err = b.route.owns(ctx, node, keys)
	}
	return classify(b.route.redirected(err))
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
