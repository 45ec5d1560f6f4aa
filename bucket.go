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
	cfg  config
	node func(ctx context.Context, key string) (*redis.Client, error)

	// clientScoped: every rule is per-client, so a decision needs only the
	// (resource, client) lock and that client's logs.
	clientScoped  bool
	hasClientRule bool
	maxN          int   // the smallest Requests of the rules
	logTTL        int64 // the longest window, ms: how long a log is needed
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
	b := &Bucket{cfg: cfg, node: node, clientScoped: true, maxN: cfg.rules[0].Limit.Requests}
	for _, r := range cfg.rules {
		b.clientScoped = b.clientScoped && r.Scope == ScopeClient
		b.hasClientRule = b.hasClientRule || r.Scope == ScopeClient
		b.maxN = min(b.maxN, r.Limit.Requests)
		b.logTTL = max(b.logTTL, r.Limit.windowMillis())
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
// request is recorded nowhere. A denial is a Result with Allowed false, not
// an error. The client may be empty only if every rule is per-resource.
//
// Errors: ErrEmptyResource, ErrEmptyClient or ErrInvalidWeight for bad input
// (nothing is sent to Redis); ErrLockNotObtained if another decision held the
// lock until ctx ended or the retry strategy gave up; ErrLockExpired if the lock expired before the
// decision was written; or a Redis error, wrapped. With any error, nothing
// was recorded, except that a connection lost during the final write leaves
// it unknown whether the write was applied.
func (b *Bucket) AllowN(ctx context.Context, resource, client string, n int) (Result, error) {
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return Result{}, err
	}
	var res Result
	err = node.Watch(ctx, func(tx *redis.Tx) error {
		var err error
		res, err = b.admit(ctx, tx, keys, client, n)
		return err
	})
	if err != nil {
		return Result{}, wrap(err)
	}
	return res, nil
}

// admit is the critical section of AllowN, on one connection: take the lock
// and read the logs (one round trip), then write the new log and release
// the lock in one MULTI/EXEC (one more).
func (b *Bucket) admit(ctx context.Context, tx *redis.Tx, keys keyspace, client string, n int) (Result, error) {
	lockKey := keys.resourceLock()
	if b.clientScoped {
		lockKey = keys.clientLock(client)
	}
	l := newLock(lockKey, b.cfg.lockTTL, b.cfg.lockRetry())
	defer l.cleanup(ctx, tx)

	scan := b.scan(keys, client)
	if err := l.obtain(ctx, tx, func(pipe redis.Pipeliner) { scan.queue(ctx, pipe) }); err != nil {
		return Result{}, err
	}
	if err := scan.finish(ctx, tx); err != nil {
		return Result{}, err
	}
	res := evaluate(b.cfg.rules, scan.entries, scan.now, encode(client), n)
	err := l.release(ctx, tx, func(pipe redis.Pipeliner) {
		if res.Allowed {
			pipe.Do(ctx, "set", keys.newLog(client, scan.now, n), "", "pxat", scan.now+b.logTTL)
		}
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// scan returns a count of the logs the rules need: the client's own when
// every rule is per-client, else the whole resource's.
func (b *Bucket) scan(keys keyspace, client string) *logScan {
	if b.clientScoped {
		return newLogScan(keys, keys.clientLogs(client), b.cfg.scanCount)
	}
	return newLogScan(keys, keys.logs(), b.cfg.scanCount)
}

// Peek is shorthand for PeekN(ctx, resource, client, 1).
func (b *Bucket) Peek(ctx context.Context, resource, client string) (Result, error) {
	return b.PeekN(ctx, resource, client, 1)
}

// PeekN returns what AllowN would answer now, recording nothing: Remaining
// is what would be left after the call. It takes no lock, so a decision
// under way elsewhere may be missed. It costs one round
// trip when the SCAN fits in one page.
func (b *Bucket) PeekN(ctx context.Context, resource, client string, n int) (Result, error) {
	if err := b.check(resource, client, n); err != nil {
		return Result{}, err
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return Result{}, err
	}
	scan := b.scan(keys, client)
	if err := scan.finish(ctx, node); err != nil {
		return Result{}, wrap(err)
	}
	return evaluate(b.cfg.rules, scan.entries, scan.now, encode(client), n), nil
}

// Flush forgets the logs of client at resource: its own counts and its share
// of the resource's counts. Logs of a decision running at the same time may
// survive.
func (b *Bucket) Flush(ctx context.Context, resource, client string) error {
	if err := b.check(resource, client, 1); err != nil {
		return err
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return err
	}
	return wrap(deleteLogs(ctx, node, keys.clientLogs(client), b.cfg.scanCount))
}

// FlushAll forgets every log of resource, for all clients and rules.
func (b *Bucket) FlushAll(ctx context.Context, resource string) error {
	if resource == "" {
		return ErrEmptyResource
	}
	keys, node, err := b.locate(ctx, resource)
	if err != nil {
		return err
	}
	return wrap(deleteLogs(ctx, node, keys.logs(), b.cfg.scanCount))
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
