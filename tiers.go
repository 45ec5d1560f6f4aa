package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/breaker"
)

// ErrUnknownTier: a Tiers was asked to decide for a tier it has no rules
// for (never Set, or Deleted).
var ErrUnknownTier = errors.New("leakybucket: unknown tier")

// Tiers serves clients whose rules depend on who they are: a free tier of
// 10 requests a minute and a pro tier of 100, say, chosen per call. It
// holds one Bucket per tier, all made with the same Redis client and the
// same shared options (prefix, strategy, lock...), and Set replaces a
// tier's rules at run time: the new Bucket is swapped in atomically, calls
// under way finish on the old one, and the next ones use the new rules.
// It is safe for concurrent use; AllowN takes no lock.
//
// Counts belong to the resource and client, not to the tier, wherever the
// tiers' Buckets share a key layout: the same prefix, strategy, longest
// window and (under Windows) precisions. Then a client who moves from one
// tier to another, or whose tier's limit is raised or lowered, keeps what
// it used. Whether a strategy keeps counts across a change of Requests:
//
//   - Logs and Windows key their counts by resource and client only, so
//     tiers that differ only in Requests share every count: a client that
//     used 8 of free's 10 has 92 of pro's 100 left, and lowering a limit
//     below what a client used denies it until enough leaves the window.
//   - SortedSet keeps one set per rule, named by its window and Requests,
//     so a tier with other Requests counts in sets
//     of its own: a client changing tier, or a limit changing, starts
//     from zero under the new rules (the old sets expire on their own).
//     Changing this would change the key layout of the core.
//   - Under any strategy, tiers whose longest window or precision differ
//     (free 10 a minute, pro 1000 an hour) keep their counts apart.
//
// Use Logs or Windows where counts must follow clients across tiers.
//
// Set changes a tier in this process only. With WithSharedLimits among
// the shared options, the tiers' rules live in Redis, so that SetLimits
// (or the ops command's "limits set") changes a tier's limits in every
// process that serves it, within a refresh interval, counts kept.
//
// The tiers' Buckets share what they learn of a server's outage, so the
// first call that finds Redis gone switches every tier. With WithFallback
// among the shared options, each tier's Bucket then decides in process by
// the shares of its own rules, on counts of its own: a Set during an
// outage makes a Bucket whose counts in process start empty.
type Tiers struct {
	rdb    redis.UniversalClient // nil in process (NewLocalTiers)
	local  bool                  // NewLocalTiers: Buckets of NewLocal
	shared []Option
	limits sharedLimits // the rules kept in Redis (WithSharedLimits)

	mu      sync.Mutex                         // serializes Set, Delete and changes of limits
	defs    map[string]tierDef                 // under mu: each tier as Set gave it
	buckets atomic.Pointer[map[string]*Bucket] // copied on write, never changed
}

// tierDef is a tier as Set gave it: its options, and the rules they make.
type tierDef struct {
	opts  []Option
	rules []Rule
}

// effective returns the rules the tier decides by: stored, those Redis
// holds for it, if they have the shape of the code's; else the code's.
func (d tierDef) effective(stored []Rule) []Rule {
	if stored != nil && sameShape(d.rules, stored) {
		return stored
	}
	return d.rules
}

// NewTiers returns a Tiers with no tier yet, whose Buckets are made on rdb
// with the shared options (all but the rules: WithStrategy, WithPrefix,
// WithObserver...). It returns ErrUnsupportedClient as New does; the
// options are checked with each tier's rules, by Set. It sends nothing to
// Redis. Add tiers with Set.
func NewTiers(rdb redis.UniversalClient, shared ...Option) (*Tiers, error) {
	if _, err := nodeOf(rdb); err != nil {
		return nil, err
	}
	// The tiers' Buckets share what they learn of a server's outage: it
	// costs the process one call, not one per tier.
	breakers := &breaker.Breakers{}
	shared = append(slices.Clone(shared), func(c *config) { c.breakers = breakers })
	cfg := defaultConfig()
	for _, opt := range shared {
		if opt != nil {
			opt(&cfg)
		}
	}
	if cfg.limitsRefresh < 0 {
		return nil, fmt.Errorf("%w: WithSharedLimits(%v): a negative refresh", ErrInvalidOption, cfg.limitsRefresh)
	}
	t := &Tiers{rdb: rdb, shared: shared, defs: map[string]tierDef{},
		limits: sharedLimits{key: cfg.prefix + ":limits", refresh: cfg.limitsRefresh, start: time.Now()}}
	t.buckets.Store(&map[string]*Bucket{})
	return t, nil
}

// NewLocalTiers returns a Tiers whose Buckets keep their counts in this
// process's memory, as NewLocal's do, made with the shared options. Its
// SetLimits changes a tier's limits in this process only, keeping every
// count (under Logs, Windows and FixedWindows), and so does a Set of a
// tier with rules that differ in Requests only; as with WithSharedLimits,
// limits that SetLimits set decide over a later Set's of the same shape.
// Limits returns what SetLimits set. Each tier keeps counts of its own: a
// client that moves from one tier to another starts from zero.
// WithSharedLimits changes nothing. It returns no error today; the error
// is New's and NewLocal's shape, kept for options it may check.
func NewLocalTiers(shared ...Option) (*Tiers, error) {
	t := &Tiers{local: true, shared: slices.Clone(shared), defs: map[string]tierDef{}}
	t.buckets.Store(&map[string]*Bucket{})
	return t, nil
}

// Set makes the rules (PerResource, PerClient, and any other Option, which
// overrides the shared ones for this tier only) those of tier, adding the
// tier or replacing its rules; the next call of the tier decides by them.
// It returns New's error, and leaves the tier as it was, if the rules are
// invalid, and an ErrInvalidOption error for an empty tier name. Counts are kept as the Tiers type describes.
//
// With WithSharedLimits, rules are the tier's rules in code: where Redis
// holds rules of their shape for the tier, the tier decides by those (see
// WithSharedLimits), and Set returns an ErrInvalidOption error for a
// strategy whose counts depend on the limit (SortedSet, GCRA).
func (t *Tiers) Set(tier string, rules ...Option) error {
	if tier == "" {
		return fmt.Errorf("%w: empty tier name", ErrInvalidOption)
	}
	def := tierDef{opts: slices.Clone(rules)}
	b, err := t.newBucket(append(slices.Clip(t.shared), def.opts...))
	switch {
	case err != nil:
		return fmt.Errorf("leakybucket: tier %q: %w", tier, err)
	case t.limits.refresh > 0 && !keepsCounts(b.cfg.strategy):
		return fmt.Errorf("%w: tier %q: WithSharedLimits: strategy %v names its counts by their limit, so a change would lose them", ErrInvalidOption, tier, b.cfg.strategy)
	}
	def.rules = b.cfg.rules
	t.mu.Lock()
	defer t.mu.Unlock()
	old, _ := t.bucket(tier)
	if sb, err := t.build(def, t.limits.stored[tier], old); err == nil {
		b = sb
	}
	t.defs[tier] = def
	t.updateLocked(func(m map[string]*Bucket) { m[tier] = b })
	return nil
}

// build returns a Bucket of the tier def, by the rules stored in Redis
// for it, if they have the shape of its own. In process, it keeps the
// counts of old, the tier's Bucket until now, where they count alike.
func (t *Tiers) build(def tierDef, stored []Rule, old *Bucket) (*Bucket, error) {
	opts := append(slices.Clip(t.shared), def.opts...)
	b, err := t.newBucket(append(opts, withRules(def.effective(stored))))
	if err != nil || !t.local || old == nil || !countsAlike(old, b) {
		return b, err
	}
	if c, ok := old.counts.(*localCounts).withLimits(b.plan); ok {
		b.counts = c
	}
	return b, nil
}

// countsAlike reports whether Buckets a and b keep the same counts, and
// differ at most in their rules' Requests.
func countsAlike(a, b *Bucket) bool {
	return a.cfg.strategy == b.cfg.strategy && keepsCounts(a.cfg.strategy) &&
		a.cfg.recordDenied == b.cfg.recordDenied && sameShape(a.cfg.rules, b.cfg.rules)
}

// newBucket returns a Bucket of opts: on Redis (New), or in process
// (NewLocal) for NewLocalTiers.
func (t *Tiers) newBucket(opts []Option) (*Bucket, error) {
	if t.local {
		return NewLocal(opts...)
	}
	return New(t.rdb, opts...)
}

// Delete removes tier: its calls return ErrUnknownTier from then on. Its
// counts stay in Redis until they expire, and so do its rules (see
// WithSharedLimits).
func (t *Tiers) Delete(tier string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.defs, tier)
	t.updateLocked(func(m map[string]*Bucket) { delete(m, tier) })
}

// updateLocked swaps in a copy of the tiers, changed by change. It
// requires t.mu.
func (t *Tiers) updateLocked(change func(map[string]*Bucket)) {
	m := maps.Clone(*t.buckets.Load())
	change(m)
	t.buckets.Store(&m)
}

// Bucket returns the Bucket that decides tier's calls now, and whether the
// tier exists. After a Set of the tier, or a change of its limits, it is a
// new Bucket: ask again rather than keep it. With WithSharedLimits, it
// first reads the rules from Redis if they are stale, for up to a second.
func (t *Tiers) Bucket(tier string) (*Bucket, bool) {
	if t.limits.stale() {
		ctx, cancel := context.WithTimeout(context.Background(), limitsReadTimeout)
		defer cancel()
		t.fresh(ctx)
	}
	return t.bucket(tier)
}

// bucket is Bucket without a read of the rules.
func (t *Tiers) bucket(tier string) (*Bucket, bool) {
	b, ok := (*t.buckets.Load())[tier]
	return b, ok
}

// Names returns the tiers, sorted.
func (t *Tiers) Names() []string {
	return slices.Sorted(maps.Keys(*t.buckets.Load()))
}

// Allow is shorthand for AllowN(ctx, tier, resource, client, 1).
func (t *Tiers) Allow(ctx context.Context, tier, resource, client string) (Result, error) {
	return t.AllowN(ctx, tier, resource, client, 1)
}

// AllowN is Bucket.AllowN under the rules of tier: the Result reports
// them. It returns an error matching ErrUnknownTier if the tier has no
// rules. With WithSharedLimits, it first reads the rules from Redis if
// they are stale, within ctx.
func (t *Tiers) AllowN(ctx context.Context, tier, resource, client string, n int) (Result, error) {
	t.fresh(ctx)
	b, ok := t.bucket(tier)
	if !ok {
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownTier, tier)
	}
	return b.AllowN(ctx, resource, client, n)
}
