package leakybucket

import (
	"fmt"
	"math"
	"time"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/store"
)

// A Strategy is how a Bucket keeps its counts in Redis: Logs (the default),
// SortedSet or Windows(precision), sliding windows; or GCRA, a leaky
// bucket, which counts a rate and a burst instead of a window. Every strategy answers the same calls
// with the same Results and errors, and every one counts in Redis time, so
// hosts with skewed clocks share one window. They differ in round trips, in
// what a decision costs as the database grows, in memory, and in
// exactness:
//
//	strategy            round trips  exact              a decision walks     memory per count
//	Logs                2, locked    to the ms          the whole database   one key per batch of calls in the window
//	SortedSet           1            to the ms          O(log n) of one set  at most Requests members per rule
//	Windows(precision)  1            up to a precision  a few totals, or     one field per interval of each precision in the window,
//	                                                    the window's hashes  and in the one before
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
	newStore(p plan) (store.Store, error)

	// counting returns how NewLocal counts the calls of a Bucket with
	// these rules, as the store would, or newStore's error.
	counting(p plan) (counting, error)
}

// counting is how a strategy counts calls: in the intervals of a layout
// (Windows), or one by one, capped at each rule's Requests (SortedSet with
// WithRecordDenied), or neither (Logs, and SortedSet otherwise); or, tats,
// in one bucket per rule and scope (GCRA).
type counting struct {
	layout *intervals.Layout
	capped bool
	tats   bool
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
	// per-resource rule, each (resource, client) for a per-client one):
	// one member per unit of weight, scored by Redis time. A decision is
	// one MULTI/EXEC that trims the window, counts it and adds the call,
	// in O(log n), with no lock; the call is decided from the count, and
	// taken back by a second one if it was denied. It is exact to within
	// the error of its estimate of Redis's clock (a stamp may be early,
	// never late). A rule's Requests may be at most 1 000 000.
	SortedSet Strategy = sortedSetStrategy{}
)

// Windows returns the strategy that keeps, per scope (the resource, and
// each (resource, client) if a rule is per-client), the weight admitted in
// each interval of precision, in a hash per epoch (as long as the longest
// window, counted from the Unix epoch: a one-hour window at a precision of
// one minute is at most 60 fields per epoch), and their total. A decision
// is one MULTI/EXEC that adds the call to its interval and its epoch's
// total with HINCRBY; a call this Bucket saw far from every limit is
// decided on the totals of the epochs its windows reach, a bound of its
// count (Result says what that leaves exact), and any other on every
// interval; a denied call is then taken back (a second round trip, whose
// cost the caller does not wait for). Memory is bounded by
// window/precision however many calls are made. A rule's Requests may be
// at most 2^50.
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
// an error matching ErrInvalidOption. For fixed
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
// earlier; a decision Redis ran in the next window is made again, stamped
// in it. So no fixed window ever holds more than its limit, and every call
// counts in the window Redis ran it in.
var FixedWindows Strategy = windowsStrategy{fixed: true}

// plan is what the stores need to know of the rules and options, and the
// rules as Results name them.
type plan struct {
	store.Plan
	public []Rule // the same rules as Plan.Rules, as given to New
	// maxN is the smallest Requests of the rules: a heavier call is never
	// admitted (see Never). largest is the largest: no rule reads further
	// for a heavier call.
	maxN, largest int
	// fallback: the plan of a fallback's shares of the rules (see
	// WithFallback), whose Results say so.
	fallback bool
	// locking is the Logs store's alone (WithLockTTL, WithLockWait).
	locking store.Locking
	// replicas is WithReplicas', which GCRA refuses.
	replicas int
}

func newPlan(cfg config) plan {
	p := plan{public: cfg.rules, Plan: store.Plan{ClientScoped: true, RecordDenied: cfg.recordDenied, ScanCount: cfg.scanCount},
		locking: store.Locking{TTL: cfg.lockTTL, Wait: cfg.lockWait}, maxN: math.MaxInt, replicas: cfg.replicas}
	for _, public := range cfg.rules {
		r := public.model()
		p.Rules = append(p.Rules, r)
		p.ClientScoped = p.ClientScoped && r.PerClient
		p.HasClientRule = p.HasClientRule || r.PerClient
		p.Longest = max(p.Longest, r.Window)
		p.maxN = min(p.maxN, r.Requests)
		p.largest = max(p.largest, r.Requests)
	}
	return p
}

// exact checks that no rule has a precision: a strategy other than Windows
// counts every call at its millisecond, and a precision would say that it
// does not.
func exact(s Strategy, p plan) error {
	for _, r := range p.public {
		if r.Limit.Precision != 0 {
			return invalidStrategy(s, "rule %v has a precision: only Windows counts in intervals", r)
		}
	}
	return nil
}

func invalidStrategy(s Strategy, format string, args ...any) error {
	return fmt.Errorf("%w: strategy %v: %w", ErrInvalidOption, s, fmt.Errorf(format, args...))
}

// windowsStrategy is Windows(precision), or FixedWindows if fixed.
type windowsStrategy struct {
	precision time.Duration
	fixed     bool
}

// String returns "windows(1s)", or "fixed windows".
func (w windowsStrategy) String() string {
	if w.fixed {
		return "fixed windows"
	}
	return "windows(" + w.precision.String() + ")"
}

// maxWindowsRequests bounds the Requests of a rule under Windows, so that
// no interval's HINCRBY can overflow, even with a thousand calls of the
// largest weight not yet taken back.
const maxWindowsRequests = 1 << 50

func (w windowsStrategy) newStore(p plan) (store.Store, error) {
	if err := w.check(p); err != nil {
		return nil, err
	}
	return store.NewWindows(p.Plan, w.precision), nil
}

func (w windowsStrategy) counting(p plan) (counting, error) {
	if err := w.check(p); err != nil {
		return counting{}, err
	}
	layout := intervals.New(w.precision, p.Rules)
	return counting{layout: &layout}, nil
}

// check returns an ErrInvalidOption error if Windows cannot keep p's
// rules.
func (w windowsStrategy) check(p plan) error {
	if !w.fixed && w.precision < time.Millisecond {
		return invalidStrategy(w, "precision %v is under 1ms (FixedWindows makes the rules without a precision fixed windows)", w.precision)
	}
	for _, r := range p.public {
		if r.Limit.Requests > maxWindowsRequests {
			return invalidStrategy(w, "rule %v: more than maxWindowsRequests (%d)", r, maxWindowsRequests)
		}
		if r.Limit.Precision != 0 || w.fixed {
			continue // its own precision (checked by New), or a fixed window
		}
		if err := checkPrecision(w.precision, r.Limit.Window); err != nil {
			return invalidStrategy(w, "rule %v: %w", r, err)
		}
	}
	return nil
}

type sortedSetStrategy struct{}

func (sortedSetStrategy) String() string { return "sorted set" }

// maxSortedSetRequests bounds the Requests of a rule under SortedSet,
// which keeps one member (about 50 bytes) per unit of weight counted: a
// full set at this limit holds about 50 MB, and a call of weight n sends n
// members.
const maxSortedSetRequests = 1_000_000

func (st sortedSetStrategy) newStore(p plan) (store.Store, error) {
	if err := st.check(p); err != nil {
		return nil, err
	}
	return store.NewSortedSet(p.Plan), nil
}

func (st sortedSetStrategy) counting(p plan) (counting, error) {
	return counting{capped: p.RecordDenied}, st.check(p)
}

// check returns an ErrInvalidOption error if SortedSet cannot keep p's
// rules.
func (st sortedSetStrategy) check(p plan) error {
	if err := exact(st, p); err != nil {
		return err
	}
	for _, r := range p.public {
		if r.Limit.Requests > maxSortedSetRequests {
			return invalidStrategy(st, "rule %v: more than maxSortedSetRequests (%d): it keeps a member per unit of weight", r, maxSortedSetRequests)
		}
	}
	return nil
}

type logsStrategy struct{}

func (logsStrategy) String() string { return "logs" }

func (st logsStrategy) newStore(p plan) (store.Store, error) {
	if err := exact(st, p); err != nil {
		return nil, err
	}
	return store.NewLogs(p.Plan, p.locking), nil
}

func (st logsStrategy) counting(p plan) (counting, error) { return counting{}, exact(st, p) }
