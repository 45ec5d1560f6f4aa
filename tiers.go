package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

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
// The tiers' Buckets share what they learn of a server's outage, so the
// first call that finds Redis gone switches every tier. With WithFallback
// among the shared options, each tier's Bucket then decides in process by
// the shares of its own rules, on counts of its own: a Set during an
// outage makes a Bucket whose counts in process start empty.
type Tiers struct {
	rdb    redis.UniversalClient
	shared []Option

	mu      sync.Mutex                         // serializes Set and Delete
	buckets atomic.Pointer[map[string]*Bucket] // copied on write, never changed
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
	t := &Tiers{rdb: rdb, shared: shared}
	t.buckets.Store(&map[string]*Bucket{})
	return t, nil
}

// Set makes the rules (PerResource, PerClient, and any other Option, which
// overrides the shared ones for this tier only) those of tier, adding the
// tier or replacing its rules; the next call of the tier decides by them.
// It returns New's error, and leaves the tier as it was, if the rules are
// invalid, and an ErrInvalidOption error for an empty tier name. Counts are kept as the Tiers type describes.
func (t *Tiers) Set(tier string, rules ...Option) error {
	if tier == "" {
		return fmt.Errorf("%w: empty tier name", ErrInvalidOption)
	}
	b, err := New(t.rdb, append(slices.Clip(t.shared), rules...)...)
	if err != nil {
		return fmt.Errorf("leakybucket: tier %q: %w", tier, err)
	}
	t.update(func(m map[string]*Bucket) { m[tier] = b })
	return nil
}

// Delete removes tier: its calls return ErrUnknownTier from then on. Its
// counts stay in Redis until they expire.
func (t *Tiers) Delete(tier string) {
	t.update(func(m map[string]*Bucket) { delete(m, tier) })
}

// update swaps in a copy of the tiers, changed by change.
func (t *Tiers) update(change func(map[string]*Bucket)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := maps.Clone(*t.buckets.Load())
	change(m)
	t.buckets.Store(&m)
}

// Bucket returns the Bucket that decides tier's calls now, and whether the
// tier exists. After a Set of the tier it is a new Bucket: ask again
// rather than keep it.
func (t *Tiers) Bucket(tier string) (*Bucket, bool) {
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
// rules.
func (t *Tiers) AllowN(ctx context.Context, tier, resource, client string, n int) (Result, error) {
	b, ok := t.Bucket(tier)
	if !ok {
		return Result{}, fmt.Errorf("%w: %q", ErrUnknownTier, tier)
	}
	return b.AllowN(ctx, resource, client, n)
}
