// Package inflight limits how many operations run at once, per resource
// and per client, across every process that shares one Redis (or in this
// process alone, with NewLocal): a distributed, weighted semaphore without
// Lua scripting.
//
// It has the shape of golang.org/x/sync/semaphore: Acquire waits for room
// until its context ends, TryAcquire does not wait, and each acquisition
// is a Lease to release. Unlike an in-process semaphore, a holder may die
// without releasing: every Lease has a time to live, after which it no
// longer counts, and a holder that works longer extends it (Extend, or
// KeepAlive while it runs). Several limits apply at once (PerResource,
// PerClient), all or nothing: a call takes room in every limit or in none.
//
// On Redis, one MULTI/EXEC decides an acquisition, without a lock: each
// limit is a sorted set of leases scored by their deadlines, in Redis's
// time, capped so that it never holds more than its limit (see the
// package's design notes in docs/inflight.md). Waiters wait in a queue, in
// order of arrival, and are woken when a lease is released or expires.
package inflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/breaker"
)

// Errors. Each matches with errors.Is and keeps its cause.
var (
	// ErrUnavailable: Redis could not be reached or did not answer. It is
	// the same error as leakybucket.ErrUnavailable.
	ErrUnavailable = breaker.ErrUnavailable
	// ErrExpired: the lease's time to live ran out before it was released
	// or extended: it had stopped counting, and others may hold its room.
	ErrExpired = errors.New("inflight: lease expired")
	// ErrNotHeld: no such lease is held: it was released already, the id
	// names no lease this limiter gave, or the Lease is nil (none was
	// acquired).
	ErrNotHeld = errors.New("inflight: lease not held")
	// ErrInvalid: bad input, and the text says which and what would be
	// accepted: no limit, or one outside [1, MaxLimit], an empty prefix or
	// one with a brace (New, NewLocal); a time to live under a millisecond
	// (New, NewLocal, LeaseTTL, Extend); an empty resource or client, or a
	// weight under 1 (the acquisitions, Held); a malformed lease id (ParseID,
	// Limiter.Release); a Lease from ParseID released or extended itself.
	// Nothing was sent to Redis.
	ErrInvalid = errors.New("inflight: invalid argument")
	// ErrTooHeavy: the weight asked for exceeds a limit, so it can never
	// be held (the acquisitions; nothing was sent to Redis).
	ErrTooHeavy = errors.New("inflight: weight exceeds the limit")
	// ErrUnsupportedClient: New was given a nil client, or one other than
	// *redis.Client, *redis.ClusterClient or *redis.Ring.
	ErrUnsupportedClient = errors.New("inflight: unsupported redis client: want *redis.Client, *redis.ClusterClient or *redis.Ring")
)

// Defaults.
const (
	// DefaultTTL is how long a lease lives unless WithTTL or LeaseTTL say
	// otherwise.
	DefaultTTL = 30 * time.Second
	// DefaultPrefix starts every key the limiter writes.
	DefaultPrefix = "inflight"
)

// A Limiter limits how much weight is held at once, by its limits. Make
// one with New or NewLocal; it is safe for concurrent use.
type Limiter struct {
	cfg   config
	store backend
}

// backend keeps the leases: in Redis (remote) or in this process (local).
type backend interface {
	acquire(ctx context.Context, c call, wait bool) (*Lease, error)
	release(ctx context.Context, le *Lease) error
	extend(ctx context.Context, le *Lease, ttl time.Duration) error
	held(ctx context.Context, resource string) (Usage, error)
}

// An Option configures a Limiter.
type Option func(*config)

type config struct {
	resourceLimit int  // 0: none
	clientLimit   int  // 0: none
	resourceSet   bool // PerResource was given (so a 0 is its, and refused)
	clientSet     bool // PerClient was given
	ttl           time.Duration
	prefix        string
	observer      Observer
}

// PerResource limits the weight held at once at each resource, by every
// client together, to n.
func PerResource(n int) Option {
	return func(c *config) { c.resourceLimit, c.resourceSet = n, true }
}

// PerClient limits the weight held at once by each client at each
// resource to n.
func PerClient(n int) Option {
	return func(c *config) { c.clientLimit, c.clientSet = n, true }
}

// WithTTL sets how long a lease lives unless extended (DefaultTTL). A
// holder that dies stops counting this long after its lease was last
// acquired or extended.
func WithTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// WithPrefix sets the prefix of every key (DefaultPrefix). Limiters on
// one prefix must agree on their limits, as their keys carry them. The
// prefix must not be empty nor contain '{' or '}'.
func WithPrefix(p string) Option { return func(c *config) { c.prefix = p } }

// WithObserver reports each acquisition, refusal and release to o.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// MaxLimit bounds a limit: each unit of weight a lease holds is a member
// of a sorted set.
const MaxLimit = 1 << 16

func configure(opts []Option) (config, error) {
	cfg := config{ttl: DefaultTTL, prefix: DefaultPrefix}
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if err := cfg.checkLimits(); err != nil {
		return cfg, err
	}
	switch {
	case cfg.ttl < time.Millisecond:
		return cfg, fmt.Errorf("%w: WithTTL(%v): want 1ms or more", ErrInvalid, cfg.ttl)
	case cfg.prefix == "":
		return cfg, fmt.Errorf("%w: WithPrefix(\"\"): want a non-empty prefix (default %q)", ErrInvalid, DefaultPrefix)
	case strings.ContainsAny(cfg.prefix, "{}"):
		// A brace would move the hash tag that keeps a resource's keys in
		// one cluster slot (the Bucket refuses it too).
		return cfg, fmt.Errorf("%w: WithPrefix(%q): want a prefix without '{' or '}'", ErrInvalid, cfg.prefix)
	}
	return cfg, nil
}

// checkLimits requires a limit, and each limit given in [1, MaxLimit]: a
// PerResource(0) beside a PerClient(1) is a mistake, not "no per-resource
// limit", which is said by leaving PerResource out.
func (cfg config) checkLimits() error {
	if !cfg.resourceSet && !cfg.clientSet {
		return fmt.Errorf("%w: no limit: give PerResource(n) or PerClient(n), n in [1, %d]", ErrInvalid, MaxLimit)
	}
	limits := []struct {
		option string
		n      int
		set    bool
	}{{"PerResource", cfg.resourceLimit, cfg.resourceSet}, {"PerClient", cfg.clientLimit, cfg.clientSet}}
	for _, l := range limits {
		if l.set && (l.n < 1 || l.n > MaxLimit) {
			return fmt.Errorf("%w: %s(%d): a limit must be in [1, %d] (leave %[2]s out for none)", ErrInvalid, l.option, l.n, MaxLimit)
		}
	}
	return nil
}

// New returns a Limiter that keeps its leases in rdb (a *redis.Client, a
// *redis.ClusterClient or a *redis.Ring), shared by every process that
// uses the same prefix. It checks the options and sends nothing.
func New(rdb redis.UniversalClient, opts ...Option) (*Limiter, error) {
	cfg, err := configure(opts)
	if err != nil {
		return nil, err
	}
	r, err := newRemote(rdb, cfg)
	if err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, store: r}, nil
}

// NewLocal returns a Limiter that keeps its leases in this process's
// memory: the same limits and methods as New, for one instance or tests.
// Time is this host's monotonic clock.
func NewLocal(opts ...Option) (*Limiter, error) {
	cfg, err := configure(opts)
	if err != nil {
		return nil, err
	}
	return &Limiter{cfg: cfg, store: newLocal(cfg)}, nil
}

// An AcquireOption changes one acquisition.
type AcquireOption func(*call)

// LeaseTTL sets the time to live of this lease, instead of the
// Limiter's.
func LeaseTTL(d time.Duration) AcquireOption { return func(c *call) { c.ttl = d } }

// call is one acquisition's input.
type call struct {
	resource, client string
	n                int
	ttl              time.Duration
	grace            time.Duration // how long past ctx's deadline an attempt under way is awaited (AcquireWithin)
}

// check checks a call's input, with its options applied.
func (l *Limiter) check(resource, client string, n int, opts []AcquireOption) (call, error) {
	c := call{resource: resource, client: client, n: n, ttl: l.cfg.ttl}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if err := checkNames(resource, client); err != nil {
		return c, err
	}
	switch most := l.cfg.most(); {
	case n < 1:
		return c, fmt.Errorf("%w: weight %d: want 1 or more", ErrInvalid, n)
	case n > most:
		return c, fmt.Errorf("%w: weight %d: the limits hold at most %d", ErrTooHeavy, n, most)
	case c.ttl < time.Millisecond:
		return c, fmt.Errorf("%w: LeaseTTL(%v): want 1ms or more", ErrInvalid, c.ttl)
	}
	return c, nil
}

// checkNames refuses an empty resource or client, as the Bucket does: a
// lease names both (its keys, its ID, Held's holders).
func checkNames(resource, client string) error {
	switch {
	case resource == "":
		return errEmptyResource
	case client == "":
		return fmt.Errorf("%w: empty client: want a non-empty name (a lease names its holder)", ErrInvalid)
	}
	return nil
}

// errEmptyResource is the error of a call at the empty resource.
var errEmptyResource = fmt.Errorf("%w: empty resource: want a non-empty name", ErrInvalid)

// most is the heaviest weight that every limit can hold.
func (cfg config) most() int {
	most := MaxLimit
	for _, limit := range []int{cfg.resourceLimit, cfg.clientLimit} {
		if limit > 0 {
			most = min(most, limit)
		}
	}
	return most
}

// Acquire is shorthand for AcquireN(ctx, resource, client, 1, opts...).
func (l *Limiter) Acquire(ctx context.Context, resource, client string, opts ...AcquireOption) (*Lease, error) {
	return l.AcquireN(ctx, resource, client, 1, opts...)
}

// AcquireN acquires weight n at resource for client, waiting for room
// until ctx ends: then it returns ctx's error, and holds nothing. Waiters
// are served in order of arrival: a waiter is never passed by one that
// came later, so a heavy one is not starved.
func (l *Limiter) AcquireN(ctx context.Context, resource, client string, n int, opts ...AcquireOption) (*Lease, error) {
	c, err := l.check(resource, client, n, opts)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	le, err := l.store.acquire(ctx, c, true)
	l.own(le)
	l.observe(c, le != nil, time.Since(start), err)
	return le, err
}

// AcquireWithin acquires weight n at resource for client, waiting for room
// at most wait (0: TryAcquireN's answer, without waiting), and within ctx:
// what a server's middleware does for each request. No room in time is a
// nil Lease and a nil error; ctx's own end is its error. An attempt to
// take room that is under way when the wait runs out is awaited, at most
// as long again as the wait (and a second), rather than thrown away: a
// waiter first in line after a release is typically one about to give up,
// and the room its attempt took would otherwise be held for nothing until
// taken back.
func (l *Limiter) AcquireWithin(ctx context.Context, resource, client string, n int, wait time.Duration, opts ...AcquireOption) (*Lease, error) {
	if wait <= 0 {
		le, _, err := l.TryAcquireN(ctx, resource, client, n, opts...)
		return le, err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	grace := func(c *call) { c.grace = min(wait, maxGrace) }
	le, err := l.AcquireN(wctx, resource, client, n, append(opts, grace)...)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, nil // the wait ran out: no room in time
	}
	return le, err
}

// maxGrace bounds how long AcquireWithin awaits an attempt under way
// past its wait.
const maxGrace = time.Second

// TryAcquire is shorthand for TryAcquireN(ctx, resource, client, 1, opts...).
func (l *Limiter) TryAcquire(ctx context.Context, resource, client string, opts ...AcquireOption) (*Lease, bool, error) {
	return l.TryAcquireN(ctx, resource, client, 1, opts...)
}

// TryAcquireN acquires weight n at resource for client if there is room
// now beyond what the waiters in line ask for (NewLocal's: if no one
// waits), without waiting. Refused, it returns false and a nil error: a
// refusal is not an error.
func (l *Limiter) TryAcquireN(ctx context.Context, resource, client string, n int, opts ...AcquireOption) (*Lease, bool, error) {
	c, err := l.check(resource, client, n, opts)
	if err != nil {
		return nil, false, err
	}
	le, err := l.store.acquire(ctx, c, false)
	l.own(le)
	l.observe(c, le != nil, 0, err)
	return le, le != nil, err
}

// own makes le, if any, l's.
func (l *Limiter) own(le *Lease) {
	if le != nil {
		le.limiter = l
	}
}

// Release releases the lease named id (Lease.ID), as Lease.Release does:
// for a holder that kept only the id.
func (l *Limiter) Release(ctx context.Context, id string) error {
	le, err := ParseID(id)
	if err != nil {
		return err
	}
	le.limiter = l
	return le.Release(ctx)
}

// Held returns what is held at resource, and by whom: the leases of the
// per-resource limit (on Redis, a Limiter with per-client limits only
// reports none: they are kept per client).
func (l *Limiter) Held(ctx context.Context, resource string) (Usage, error) {
	if resource == "" {
		return Usage{}, errEmptyResource
	}
	return l.store.held(ctx, resource)
}

// Usage is what is held at a resource.
type Usage struct {
	Limit   int      // the per-resource limit (0 if none)
	Held    int      // the weight held, by every client
	Waiters int      // how many wait in line (on Redis: each process's first, and this process's others)
	Holders []Holder // the live leases, soonest deadline first
}

// A Holder is one live lease.
type Holder struct {
	Client   string
	ID       string
	Weight   int
	Deadline time.Time // when it stops counting unless extended (Redis's clock)
}

// Commands are the Redis commands a Limiter sends, for an ACL user of
// least privilege (besides what go-redis sends on a new connection, and
// CLUSTER SLOTS on a cluster): its keys and channels all start with its
// prefix, so `~prefix:*` and `&prefix:*` grant them. None is a script.
var Commands = []string{
	"multi", "exec", "time", // every transaction
	"zremrangebyscore", "zrange", "zcard", "zadd", "zremrangebyrank", "pexpireat", "zinterstore", // acquire
	"zrem", "zscore", "publish", // release, extend, take-backs
	"subscribe", "unsubscribe", "ping", // waiting (ping: the subscription's health check)
	"zrangebyscore", "zcount", // Held
}
