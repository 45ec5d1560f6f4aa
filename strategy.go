package leakybucket

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/lock"
)

// A Strategy is how a Bucket keeps its counts in Redis: Logs (the default),
// SortedSet or Windows(precision). Every strategy answers the same calls
// with the same Results and errors, and every one counts in Redis time, so
// hosts with skewed clocks share one window. They differ in round trips, in
// what a decision costs as the database grows, in memory, and in
// exactness:
//
//	strategy            round trips  exact              a decision walks     memory per count
//	Logs                2, locked    to the ms          the whole database   one key per batch of calls in the window
//	SortedSet           1            to the ms          O(log n) of one set  at most Requests members per rule
//	Windows(precision)  1            up to a precision  one hash per scope   one field per interval of each precision in the window
//
// Choose SortedSet or Windows for speed (one MULTI/EXEC per decision, no
// lock: docs/design.md says why that never over-admits); Logs for nothing
// but expiring strings in a small, dedicated database. BENCHMARKS.md has
// measured figures.
type Strategy interface {
	// String names the strategy, as "sorted set" or "windows(1s)".
	String() string

	// newStore returns the store of a Bucket with these rules, or an
	// ErrInvalidOption error if the strategy cannot keep them.
	newStore(p plan) (store, error)
}

var (
	// Logs writes one expiring key per batch of admitted calls (SET PXAT)
	// and counts the live ones with SCAN MATCH, under a lock made of plain
	// SET NX: two round trips per decision, uncontended. It is
	// exact and needs nothing but strings, but SCAN walks the whole
	// database, so a decision slows down as the database grows: keep the
	// limiter in a logical database of its own. The default.
	Logs Strategy = logsStrategy{}

	// SortedSet keeps one sorted set per rule and scope (the resource for a
	// per-resource rule, each (resource, client) for a per-client one),
	// capped at the rule's Requests: one member per unit of weight, scored
	// by Redis time. A decision is one MULTI/EXEC that adds the call and
	// removes it again if it went past the cap, so it decides by the
	// call's position, in O(log n), with no lock. It is exact to within
	// the error of its estimate of Redis's clock (a stamp may be early,
	// never late). A rule's Requests may be at most 1 000 000.
	SortedSet Strategy = sortedSetStrategy{}
)

// Windows returns the strategy that keeps, per scope (the resource, and
// each (resource, client) if a rule is per-client), one hash of the weight
// admitted in each interval of precision (a one-hour window at a precision
// of one minute is at most 61 fields). A decision is one MULTI/EXEC that
// adds the call to its interval with HINCRBY and decides from the value it
// returned; a denied call is then taken back (a second round trip, whose
// cost the caller does not wait for). Memory is bounded by window/precision
// however many calls are made. A rule's Requests may be at most 2^50.
//
// A call is counted as if it was made at the end of its interval, so it
// leaves each window up to precision later than it would under Logs: Windows
// never admits a call that Logs would deny, and may deny one for at most
// precision longer (RetryAfter says for how long). Per(1, d) thus spaces
// calls by at least d and at most d+precision.
//
// precision is the default of the rules: a Limit with a Precision of its
// own counts in that one (Limit.WithPrecision), with the same bound. Rules
// of one precision share the hash's fields; each other precision adds its
// own, and an HINCRBY to the transaction. The precision is kept in whole
// milliseconds; it must be at least one, at most the window of each rule
// that takes it and at most 2^22 intervals of it, or New returns
// an error matching ErrInvalidOption and ErrInvalidPrecision. For fixed
// windows, see FixedWindows.
func Windows(precision time.Duration) Strategy { return windowsStrategy{precision: precision} }

// FixedWindows is Windows without a default precision: a rule with a
// precision of its own (Limit.WithPrecision) slides at it, and a rule
// without one is a fixed window. A fixed window counts from each multiple
// of its Window since the Unix epoch, in Redis time (a 30-minute rule
// resets at :00 and :30 UTC, a daily one at midnight UTC), and starts again
// from zero at the next; RetryAfter and ResetAfter say when that is. It is
// the cheapest rule, one field per scope, and the easiest to explain ("100
// an hour, reset on the hour"), at the price of a burst of up to twice its
// limit around a boundary, which a sliding window never admits.
//
// A call counts in the window of its stamp: this host's estimate of Redis's
// time, never later than Redis's own and normally less than a millisecond
// earlier (at most clock.Jump and a round trip, beyond which the call is
// made again). So no fixed window ever holds more than its limit, and a
// call that Redis ran in the first moment of a window may count in the
// one before.
var FixedWindows Strategy = windowsStrategy{fixed: true}

// plan is what the stores need to know of the rules and options.
type plan struct {
	rules  []limits.Rule // the Bucket's, in order
	public []Rule        // the same, as Results name them
	// clientScoped: every rule is per-client, so a decision needs only the
	// client's counts (and, under Logs, only the (resource, client) lock).
	clientScoped  bool
	hasClientRule bool
	longest       int64 // the longest window, ms: how long a call is counted
	recordDenied  bool
	scanCount     int
	lockTTL       time.Duration
	lockWait      [2]time.Duration // see WithLockWait
}

func newPlan(cfg config) plan {
	p := plan{public: cfg.rules, clientScoped: true, recordDenied: cfg.recordDenied, scanCount: cfg.scanCount,
		lockTTL: cfg.lockTTL, lockWait: cfg.lockWait}
	for _, public := range cfg.rules {
		r := public.model()
		p.rules = append(p.rules, r)
		p.clientScoped = p.clientScoped && r.PerClient
		p.hasClientRule = p.hasClientRule || r.PerClient
		p.longest = max(p.longest, r.Window)
	}
	return p
}

// A store keeps one strategy's counts: its Redis commands live in its own
// file. Every method works on one resource's site, and takes clients in
// clear text.
type store interface {
	// decide decides calls, in order, and records them: for each it calls
	// judge with what every rule counted before it, and records the call if
	// judge says so (see judgeFunc).
	decide(ctx context.Context, at site, calls []limits.Call, judge judgeFunc) error
	// peek returns what every rule counts for client, for a call of
	// weight n, without writing anything.
	peek(ctx context.Context, at site, client string, n int) (limits.View, error)
	// flush forgets every count of client: its own, and its share of the
	// resource's.
	flush(ctx context.Context, at site, client string) error
	// flushAll forgets every count of the resource.
	flushAll(ctx context.Context, at site) error
	// tag names the key layout: what a Bucket's counts depend on beyond
	// the strategy (the longest window, a precision). Buckets whose tags
	// differ never share a key, so that one never trims or expires counts
	// that the other still needs.
	tag() string
	// line names the calls one batch may hold: those decided under one
	// lock (Logs), or in one transaction of the resource's keys.
	line(ks keys.Space, client string) string
	// locked reports whether decisions take a lock. Then a line runs one
	// batch at a time, and no call needs to only look (package foresight):
	// the lock lets no other decision count a call before it is judged.
	locked() bool
	// counting is how the store counts, for NewLocal to count alike.
	counting() counting
}

// counting is how a store counts calls: in the intervals of a layout
// (Windows), or one by one, capped at each rule's Requests (SortedSet with
// WithRecordDenied), or neither (Logs, and SortedSet otherwise).
type counting struct {
	layout *intervals.Layout
	capped bool
}

// lockFree is what SortedSet and Windows share: every batch of a resource
// is one transaction of its keys, without a lock.
type lockFree struct{}

func (lockFree) line(ks keys.Space, _ string) string { return ks.Slot() }
func (lockFree) locked() bool                        { return false }

// judgeFunc evaluates call i of a batch, given v, what every rule counted
// before it, and reports whether the call is recorded: admitted (or
// denied, with WithRecordDenied), and its caller still waiting. A store
// calls it once per call, in order.
type judgeFunc func(i int, v limits.View) (recorded bool)

// site is where one resource's counts live: the node that owns them, and
// what is known of it.
type site struct {
	node  *redis.Client
	keys  keys.Space
	clock *clock.Clock // the node's clock
	route *clusterRoute
	lock  *lock.View // what this process knows of the resource's lock (Logs)
	// carry holds take-backs for the next transaction of the batch's
	// line, while busy says calls wait in it; nil outside a batch.
	carry *carried
	busy  func() bool
	// refind looks up the node that owns the keys again, after a
	// redirect.
	refind func(context.Context) (*redis.Client, error)
}

// conn is node as the connection of reads that carry no key: on a cluster,
// guarded so that they fail where the node does not own the slot.
func (s site) conn() pipeliner { return s.route.conn(s.node, s.keys) }

// pipeliner is a connection: a *redis.Client, or the *redis.Tx that holds
// the lock.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// exact checks that no rule has a precision: a strategy other than Windows
// counts every call at its millisecond, and a precision would say that it
// does not.
func exact(s Strategy, p plan) error {
	for _, r := range p.public {
		if r.Limit.Precision != 0 {
			return invalidStrategy(s, "rule %v: %w: only Windows counts in intervals", r, ErrInvalidPrecision)
		}
	}
	return nil
}

func invalidStrategy(s Strategy, format string, args ...any) error {
	return fmt.Errorf("%w: strategy %v: %w", ErrInvalidOption, s, fmt.Errorf(format, args...))
}
