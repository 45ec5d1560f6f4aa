package leakybucket

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultLimitsRefresh is WithSharedLimits' refresh interval when given 0.
const defaultLimitsRefresh = time.Second

// limitsReadTimeout bounds a read of the limits made by Tiers.Bucket,
// which has no context of its caller's.
const limitsReadTimeout = time.Second

// WithSharedLimits makes a Tiers keep its tiers' rules in Redis, so that
// a change of a limit made in any process (Tiers.SetLimits, or the ops
// command's "limits set") reaches every process that serves the tiers,
// without a restart. The rules live in one hash, named by the prefix
// (WithPrefix) and ":limits", one field per tier. Each process reads it
// again once its copy is older than refresh (0 means 1s), before the
// first call that finds it so: a call (AllowN, Allow, Bucket) that starts
// refresh or more after a SetLimits returned decides by the new rules, as
// long as the process can read Redis (and the call that reads does not
// give up on it). One call per refresh interval and
// process waits for that read, one round trip; the others do not. A
// process that cannot read Redis, or whose call gave up on the read,
// keeps the rules it had, and tries again a refresh interval later.
//
// A process that reads the hash writes there, once, the rules of each
// tier it has Set and the hash lacks (HSETNX), so that the ops command
// knows every tier. From then on the hash decides the tier's limits in
// every process; a change of a limit in code changes nothing while the
// hash holds the tier. Stored rules are applied only where they have the
// shape of the tier's rules in code: the same number, each per-client or
// per-resource, with the same Window and Precision; otherwise the
// process keeps its code's rules. So only a limit's Requests changes at
// run time, and counts are kept across a change: a lower limit denies at
// once what is over it, a higher one admits at once.
//
// Only the strategies whose counts do not depend on Requests can share
// limits: Logs, Windows and FixedWindows. SortedSet names its sets by
// their Requests, and GCRA its buckets by their rate and burst, so that a
// change would start every count from zero, admitting a client's full new
// limit on top of what it just used: Tiers.Set refuses them with an error
// matching ErrInvalidOption. New and NewLocal ignore this option; refresh
// must not be negative.
func WithSharedLimits(refresh time.Duration) Option {
	return func(c *config) {
		c.shareLimits, c.limitsRefresh = true, refresh
		if refresh == 0 {
			c.limitsRefresh = defaultLimitsRefresh
		}
	}
}

// keepsCounts reports whether a change of a rule's Requests keeps the
// counts of strategy s: whether its keys are named without Requests.
func keepsCounts(s Strategy) bool {
	switch s.(type) {
	case logsStrategy, windowsStrategy:
		return true
	}
	return false
}

// sharedLimits is what a Tiers knows of the rules kept in Redis.
type sharedLimits struct {
	key     string        // the hash of the tiers' rules
	refresh time.Duration // 0: the Tiers never reads it (no WithSharedLimits)
	start   time.Time     // the origin of due, on the monotonic clock
	due     atomic.Int64  // when to read the hash again, in ns since start
	reading sync.Mutex    // one read of the hash at a time
	stored  map[string][]Rule
}

// stale reports whether the rules read from Redis are older than refresh.
func (l *sharedLimits) stale() bool {
	return l.refresh > 0 && time.Since(l.start) >= time.Duration(l.due.Load())
}

// storedRule is a Rule as the hash keeps it, in JSON: windows in ms.
type storedRule struct {
	PerClient bool  `json:"per_client"`
	Requests  int   `json:"requests"`
	Window    int64 `json:"window_ms"`
	Precision int64 `json:"precision_ms,omitempty"`
}

// encodeRules returns rules as the hash keeps them.
func encodeRules(rules []Rule) string {
	s := make([]storedRule, len(rules))
	for i, r := range rules {
		s[i] = storedRule{PerClient: r.PerClient, Requests: r.Limit.Requests,
			Window: r.Limit.Window.Milliseconds(), Precision: r.Limit.Precision.Milliseconds()}
	}
	b, _ := json.Marshal(s) // cannot fail: plain numbers and booleans
	return string(b)
}

// decodeRules reads rules that encodeRules wrote; rules that are not
// valid, written by hand, are an error.
func decodeRules(value string) ([]Rule, error) {
	var s []storedRule
	if err := json.Unmarshal([]byte(value), &s); err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("%w: no rule", ErrInvalidOption)
	}
	rules := make([]Rule, len(s))
	for i, r := range s {
		l := Limit{Requests: r.Requests, Window: time.Duration(r.Window) * time.Millisecond,
			Precision: time.Duration(r.Precision) * time.Millisecond}
		if err := l.validate(); err != nil {
			return nil, err
		}
		rules[i] = Rule{PerClient: r.PerClient, Limit: l}
	}
	return rules, nil
}

// decodeAll returns the tiers of the hash whose rules decode: a field
// that does not is left alone, as if absent.
func decodeAll(hash map[string]string) map[string][]Rule {
	m := make(map[string][]Rule, len(hash))
	for tier, value := range hash {
		if rules, err := decodeRules(value); err == nil {
			m[tier] = rules
		}
	}
	return m
}

// sameShape reports whether rules b count in the keys of rules a, so that
// a change from a to b keeps every count: they differ in Requests only.
func sameShape(a, b []Rule) bool {
	return slices.EqualFunc(a, b, func(x, y Rule) bool {
		x.Limit.Requests, y.Limit.Requests = 0, 0
		return x == y
	})
}

// withRules replaces the rules given before it.
func withRules(rules []Rule) Option {
	return func(c *config) { c.rules = slices.Clone(rules) }
}

// SetLimits makes rules the rules of tier in Redis, for every process
// whose Tiers shares its limits (WithSharedLimits) on the same prefix,
// and applies them in this one at once. The others apply them within
// their refresh interval. Counts are kept: a client over a lowered limit
// is denied at once, one under a raised limit admitted at once.
//
// The rules must have the shape of the tier's (see WithSharedLimits):
// one per rule of the tier, in order, each with the same scope, Window
// and Precision; only Requests changes. The tier must be known: Set in
// this Tiers, or in the hash, written there by a process that shares its
// limits. Otherwise, or for a limit below 1, an empty tier name or a
// strategy whose counts depend on the limit (SortedSet, GCRA), it writes
// nothing and returns an error matching ErrInvalidOption, or
// ErrUnknownTier. Two changes of one tier at once: the last one written
// wins. The Redis user needs +hget and +hset.
func (t *Tiers) SetLimits(ctx context.Context, tier string, rules ...Rule) error {
	if tier == "" {
		return fmt.Errorf("%w: empty tier name", ErrInvalidOption)
	}
	// No read of the hash runs meanwhile: one that began before the write
	// would apply the old rules after it, here where the new ones apply at
	// once.
	t.limits.reading.Lock()
	defer t.limits.reading.Unlock()
	stored, err := t.storedRules(ctx, tier)
	if err != nil {
		return err
	}
	if err := t.checkChange(tier, stored, rules); err != nil {
		return err
	}
	if !t.local {
		if err := t.rdb.HSet(ctx, t.limits.key, tier, encodeRules(rules)).Err(); err != nil {
			return fmt.Errorf("leakybucket: writing the limits of tier %q: %w", tier, err)
		}
	}
	stored = slices.Clone(rules)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.limits.stored = maps.Clone(t.limits.stored)
	if t.limits.stored == nil {
		t.limits.stored = map[string][]Rule{}
	}
	t.limits.stored[tier] = stored
	t.applyLocked()
	return nil
}

// storedRules returns the rules Redis holds for tier: nil if none, or if
// they are not rules (written by hand: the tier's rules in code decide),
// and always in process (NewLocalTiers), where the code's decide.
func (t *Tiers) storedRules(ctx context.Context, tier string) ([]Rule, error) {
	if t.local {
		return nil, nil
	}
	value, err := t.rdb.HGet(ctx, t.limits.key, tier).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("leakybucket: reading the limits of tier %q: %w", tier, err)
	}
	rules, err := decodeRules(value)
	if err != nil {
		return nil, nil
	}
	return rules, nil
}

// checkChange returns the error of SetLimits, if any, for new rules of
// tier, stored in Redis as stored (nil: none, or unreadable).
func (t *Tiers) checkChange(tier string, stored, rules []Rule) error {
	t.mu.Lock()
	def, defined := t.defs[tier]
	t.mu.Unlock()
	base := stored
	if base == nil {
		base = def.rules
	}
	if base == nil {
		return fmt.Errorf("%w: %q: not Set in this Tiers, nor written to %q by a process that shares its limits", ErrUnknownTier, tier, t.limits.key)
	}
	opts := slices.Clip(t.shared)
	if defined {
		opts = append(opts, def.opts...)
	}
	b, err := t.newBucket(append(opts, withRules(rules))) // checks the limits
	switch {
	case err != nil:
		return fmt.Errorf("leakybucket: tier %q: %w", tier, err)
	case !keepsCounts(b.cfg.strategy):
		return fmt.Errorf("%w: tier %q: strategy %v names its counts by their limit: a change would lose them", ErrInvalidOption, tier, b.cfg.strategy)
	case !sameShape(base, rules):
		return fmt.Errorf("%w: tier %q: rules %v do not have the shape of %v: only Requests may change", ErrInvalidOption, tier, rules, base)
	}
	return nil
}

// Limits returns the rules of every tier kept in Redis under the Tiers'
// prefix (see WithSharedLimits), by tier. A field of the hash that is not
// rules, written by hand, is left out. In process (NewLocalTiers), it
// returns the rules SetLimits set. The map and slices are the caller's.
func (t *Tiers) Limits(ctx context.Context) (map[string][]Rule, error) {
	if t.local {
		t.mu.Lock()
		defer t.mu.Unlock()
		m := make(map[string][]Rule, len(t.limits.stored))
		for tier, rules := range t.limits.stored {
			m[tier] = slices.Clone(rules)
		}
		return m, nil
	}
	hash, err := t.rdb.HGetAll(ctx, t.limits.key).Result()
	if err != nil {
		return nil, fmt.Errorf("leakybucket: reading the limits: %w", err)
	}
	return decodeAll(hash), nil
}

// Refresh reads the tiers' rules from Redis now (see WithSharedLimits),
// rather than when the copy is older than the refresh interval, and
// applies them. On an error, the Tiers keeps the rules it had.
func (t *Tiers) Refresh(ctx context.Context) error {
	t.limits.reading.Lock()
	defer t.limits.reading.Unlock()
	return t.read(ctx)
}

// fresh reads the rules from Redis if they are stale. The error is
// dropped: the Tiers keeps the rules it had.
func (t *Tiers) fresh(ctx context.Context) {
	l := &t.limits
	if !l.stale() {
		return
	}
	l.reading.Lock()
	defer l.reading.Unlock()
	if l.stale() { // not read by the call this one waited for
		_ = t.read(ctx)
	}
}

// read reads the hash, writes the tiers it lacks, and applies it. The
// next read is due a refresh interval after this one began, so that no
// call decides by rules read longer ago than that. A failed read is due
// again as late, whatever failed (Redis, or the caller's context): while
// Redis is down, one call per interval pays for a read, not every call
// with its whole deadline, which the breaker (or WithFallback) would have
// answered at once. read requires l.reading.
func (t *Tiers) read(ctx context.Context) error {
	l := &t.limits
	began := time.Since(l.start)
	defer func() { l.due.Store(int64(began + l.refresh)) }()
	stored, err := t.Limits(ctx)
	if err != nil {
		return err
	}
	t.publish(ctx, stored)
	t.mu.Lock()
	defer t.mu.Unlock()
	l.stored = stored
	t.applyLocked()
	return nil
}

// publish writes the code's rules of each tier that stored lacks, unless
// another process wrote it first (HSETNX). What is written is applied by
// the next read: the hash may hold another process's rules by then. A
// failure is left to the next read.
func (t *Tiers) publish(ctx context.Context, stored map[string][]Rule) {
	t.mu.Lock()
	missing := map[string]string{}
	for tier, def := range t.defs {
		if _, ok := stored[tier]; !ok {
			missing[tier] = encodeRules(def.rules)
		}
	}
	t.mu.Unlock()
	if len(missing) == 0 {
		return
	}
	_, _ = t.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for tier, value := range missing {
			p.HSetNX(ctx, t.limits.key, tier, value)
		}
		return nil
	})
}

// applyLocked makes each tier's Bucket decide by the rules stored in
// Redis where they have the shape of its code's, else by its code's, where
// they changed. It requires t.mu.
func (t *Tiers) applyLocked() {
	m := *t.buckets.Load()
	changed := false
	for tier, def := range t.defs {
		stored := t.limits.stored[tier]
		if slices.Equal(m[tier].cfg.rules, def.effective(stored)) {
			continue
		}
		b, err := t.build(def, stored, m[tier])
		if err != nil {
			continue // New refused the code's options: keep the Bucket Set made
		}
		if !changed {
			m, changed = maps.Clone(m), true
		}
		m[tier] = b
	}
	if changed {
		t.buckets.Store(&m)
	}
}
