package leakybucket

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket/internal/breaker"
)

// Defaults of the options below, stated in their docs.
const (
	defaultPrefix    = "leakybucket"
	defaultLockTTL   = 2 * time.Second
	defaultScanCount = 1000
)

// An Option configures a Bucket. Rules are options too: PerResource and
// PerClient.
type Option func(*config)

type config struct {
	rules        []Rule
	strategy     Strategy
	recordDenied bool
	prefix       string
	lockTTL      time.Duration
	lockWait     [2]time.Duration // the first wait for a busy lock, and the longest
	scanCount    int
	observer     func(context.Context, Decision)
	noBreaker    bool
	breakers     *breaker.Breakers // nil: the Bucket's own (a Tiers shares one)
	replicas     int               // WithReplicas: 0, none
	replicaWait  time.Duration     // WithReplicas: how long a decision waits for them
	fallback     bool              // WithFallback
	instances    int               // WithFallback's: each rule's Requests is shared by them
	// WithSharedLimits, which only NewTiers reads: how long a Tiers keeps
	// the rules it read from Redis.
	shareLimits   bool
	limitsRefresh time.Duration
}

func defaultConfig() config {
	return config{
		strategy:  Logs,
		prefix:    defaultPrefix,
		lockTTL:   defaultLockTTL,
		lockWait:  [2]time.Duration{time.Millisecond, 16 * time.Millisecond},
		scanCount: defaultScanCount,
	}
}

// PerResource adds a rule with one count for the whole resource, shared by
// all its clients.
func PerResource(l Limit) Option {
	return func(c *config) { c.rules = append(c.rules, Rule{Limit: l}) }
}

// PerClient adds a rule with a count of its own for each client of a
// resource.
func PerClient(l Limit) Option {
	return func(c *config) { c.rules = append(c.rules, Rule{PerClient: true, Limit: l}) }
}

// WithStrategy sets how the Bucket keeps its counts in Redis: Logs (the
// default), SortedSet or Windows(precision). Buckets on one prefix with
// different strategies, longest windows or precisions keep their counts
// apart (see WithPrefix).
func WithStrategy(s Strategy) Option {
	return func(c *config) { c.strategy = s }
}

// WithRecordDenied makes a denied call count under every rule, as an
// admitted one does, so that a client who keeps trying stays denied until
// it pauses for a window: the rolling limiter's answer to brute force. By
// default a denied call is recorded nowhere.
//
// SortedSet then keeps only the newest Requests attempts of each rule,
// which decide exactly as all of them would (the window is full as long
// as they are in it), so its Used stops at Requests plus the call. An
// attempt that made room for itself so is never taken back: a call whose
// caller gave up once it was written, or whose transaction's reply was
// lost, stays counted, as the calls it displaced would have been.
func WithRecordDenied() Option {
	return func(c *config) { c.recordDenied = true }
}

// WithPrefix sets the text that starts every key of the Bucket (default
// "leakybucket"). Buckets may share a prefix: their keys carry a tag of
// their strategy, longest window and precision, so that Buckets that
// differ in those keep their counts apart (one would otherwise trim calls
// that the other still counts), and Buckets that agree share counts and
// locks, each applying its own rules to them. The prefix must
// not be empty nor contain '{' or '}', which would move the hash tag that
// keeps a resource's keys in one cluster slot.
func WithPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithLockTTL sets how long a decision may hold its lock (default 2s). It
// must exceed the longest decision (under Logs, a SCAN of the whole
// database included), and it is how long a resource stays blocked if a
// process dies while holding the lock. A decision that outlives it writes
// nothing and returns ErrLockExpired.
func WithLockTTL(ttl time.Duration) Option {
	return func(c *config) { c.lockTTL = ttl }
}

// WithLockWait sets how a decision waits for a lock held by another
// (Logs): waits of first, doubling up to longest, each drawn within ±25 %
// so that waiters do not poll in step, until the context ends. With first
// 0 it gives up at once (ErrLockNotObtained). Default: 1 ms up to 16 ms.
// The first waits are short because a decision holds the lock for two
// round trips: a waiter that slept 20 ms would lose every free moment of
// a busy lock to callers that just arrived.
func WithLockWait(first, longest time.Duration) Option {
	return func(c *config) { c.lockWait = [2]time.Duration{first, longest} }
}

// WithScanCount sets the COUNT hint of each SCAN call (default 1000): how
// many keys of the database, matching or not, Redis walks per round trip.
// A larger count means fewer round trips per decision but longer blocking
// calls on a large database.
func WithScanCount(n int) Option {
	return func(c *config) { c.scanCount = n }
}

// WithObserver makes the Bucket call observe with a Decision after every
// call of AllowN, AllowAtMost, PeekN, Flush and FlushAll (Allow and Peek included),
// with the caller's context, synchronously, before the method returns.
// Keep it fast: its time adds to the caller's. It cannot change what the
// method returns, and a panic in it reaches the caller, leaving the Bucket
// usable. A nil observe, the default, observes nothing; of several
// WithObserver options the last one counts.
func WithObserver(observe func(context.Context, Decision)) Option {
	return func(c *config) { c.observer = observe }
}

// WithoutBreaker turns the breaker off: every call then goes to Redis,
// even while it is known to be unreachable, and takes as long as the
// client's dial retries and timeouts allow.
//
// By default, once a call finds a server unreachable (a failed dial, a
// connection refused, reset or closed; not a read that timed out, which
// says the server is slow), the calls whose keys live there fail at
// once with ErrUnavailable, the last cause in the chain, while one
// background probe per server dials it and sends PING (each probe bounded
// by 500 ms, waiting 5 ms after the first failure, doubling up to 250 ms).
// Calls go to Redis again as soon as it answers. A call whose context ends
// while Redis is silent makes the probe look too; while the breaker is
// open, such a call's error matches ErrUnavailable and the cause as well
// as the context's error. Wait and the HTTP middleware inherit it.
func WithoutBreaker() Option {
	return func(c *config) { c.noBreaker = true }
}

// WithReplicas makes a call admitted only once n replicas of the Redis
// server that holds its counts have acknowledged its decision's writes,
// so that a failover to one of them loses no admitted call: Redis's
// WAIT n, sent after the decision's MULTI/EXEC in the same round trip
// (under Logs, after the lock's release), on a standalone server (a
// *redis.Client, or go-redis's failover client, NewFailoverClient, which
// follows Sentinel) or on each master of a Cluster, which counts its own
// replicas. The default, n = 0, waits for none.
//
// The wait ends once n replicas acknowledged, or after timeout, or sooner
// so that the call still ends within its context's deadline and the
// client's ReadTimeout: Redis notices a WAIT that timed out at its next
// cron tick, up to 100 ms late with its default hz, so the wait leaves
// that and a fifth of the time left.
// A decision whose writes too few replicas acknowledged by then admits
// no call on Redis: what the decision wrote is taken back, as for a
// denied call, and then each call fails with an error matching
// ErrUnavailable and ErrNotReplicated, or, WithFallback, is decided by
// the fallback in process, by its share of the rules. So while a replica lags
// behind by more than timeout, is paused or gone, or the server has fewer
// than n, every call fails after its wait: choose timeout above the
// replicas' usual lag (a round trip to them, a millisecond or two on a
// LAN), far below the calls' deadlines. The breaker does not open for
// it: the server answers, its replicas do not (docs/operating-redis.md).
//
// It costs each decision the replicas' acknowledgement, about one round
// trip between the server and its nearest n replicas; no round trip of
// its own. A decision settled in a transaction of its own before its
// calls are evaluated (a call Redis ran later than its stamp: re-scored
// under SortedSet, moved to a later interval under Windows) waits there
// too, for a failover that lost the settling would leave its calls
// counted as made earlier. Peek, Flush and FlushAll never wait: their writes only ever
// lower a count, which a failover that loses them restores. WAIT is not
// consensus: a failover that promotes a replica that had not
// acknowledged (one of more than n, or one that lost its data since)
// still loses counts. The client's user needs +wait (see
// docs/least-privilege.md). NewLocal ignores it. n must not be negative,
// and timeout at least a millisecond when n is positive.
func WithReplicas(n int, timeout time.Duration) Option {
	return func(c *config) { c.replicas, c.replicaWait = n, timeout }
}

// WithFallback makes the Bucket decide in this process while Redis is
// unreachable, rather than fail with ErrUnavailable. While the breaker of the server that holds a resource is open
// (see WithoutBreaker), the resource's calls are decided on counts kept
// in this process's memory, as NewLocal keeps them, by the same rules and
// strategy, each rule's Requests divided by instances and rounded down:
// instances is how many processes share the Bucket's rules, so that
// together they admit no more than a rule allows. A call whose decision
// was under way when the breaker opened, or that found the server gone,
// is decided in process too, and so is one whose decision its replicas did
// not acknowledge (WithReplicas), though the breaker stays closed for it.
// The Result says so (Result.Fallback; its
// Rules and DeniedBy name the divided rules), and so does the observer's
// Decision. Calls go to Redis again as soon as the breaker's probe finds
// the server back. What was counted in process is never written to
// Redis; it is kept, for another outage, until it leaves its windows.
//
// What holds: in any window, each process admits at most its share of
// each rule in process, whatever the number of outages in it; so a
// window that lies within an outage admits at most the rule's Requests
// across the processes, if no more than instances of them run. A window
// that spans a switch, to the process or back, may admit what Redis
// counted in it (at most the rule's Requests) and what each process
// admitted in process (at most its share): at most twice the rule. Redis
// keeps its counts through an outage only if it restarts with them (see
// docs/operating-redis.md).
//
// A slow or paused Redis is not down: its calls wait for it up to their
// deadlines, as without the fallback. While the fallback decides, PeekN
// and Usage answer from the process's counts; Flush and FlushAll forget
// the process's counts as well as Redis's, and return Redis's error if it
// could not be reached; WaitN waits as the fallback's denials say, and
// for a weight above a rule's share (RetryAfter Never), which only Redis
// can admit, asks again every 100 ms. A denial this Bucket cached
// from Redis (see docs/api.md) still answers, as Redis did.
//
// New returns an error matching ErrInvalidOption if instances is below 1,
// a rule's Requests is below instances (its share would be nothing), or
// the breaker is off (WithoutBreaker). NewLocal accepts it and changes
// nothing.
func WithFallback(instances int) Option {
	return func(c *config) { c.fallback, c.instances = true, instances }
}

func (c *config) validate() error {
	if len(c.rules) == 0 {
		return fmt.Errorf("%w: no rule: pass PerResource or PerClient", ErrInvalidOption)
	}
	for _, r := range c.rules {
		if err := r.Limit.validate(); err != nil {
			return err
		}
		if r.Limit.Burst != 0 && c.strategy != GCRA {
			return fmt.Errorf("%w: rule %v has a burst: only GCRA keeps one", ErrInvalidOption, r)
		}
	}
	return c.validateOthers()
}

// validateOthers checks the options beside the rules (NewLocal checks
// those that concern Redis too, so that a Bucket moves to Redis as it is).
func (c *config) validateOthers() error {
	switch {
	case c.strategy == nil:
		return fmt.Errorf("%w: nil strategy", ErrInvalidOption)
	case c.prefix == "":
		return fmt.Errorf("%w: empty prefix", ErrInvalidOption)
	case strings.ContainsAny(c.prefix, "{}"):
		return fmt.Errorf("%w: prefix %q contains a brace", ErrInvalidOption, c.prefix)
	case c.lockTTL < time.Millisecond:
		return fmt.Errorf("%w: lock TTL %v is under 1ms", ErrInvalidOption, c.lockTTL)
	case c.lockWait[0] < 0 || c.lockWait[1] < c.lockWait[0]:
		return fmt.Errorf("%w: lock waits from %v up to %v", ErrInvalidOption, c.lockWait[0], c.lockWait[1])
	case c.scanCount < 1:
		return fmt.Errorf("%w: SCAN COUNT %d is below 1", ErrInvalidOption, c.scanCount)
	}
	if err := c.validateReplicas(); err != nil {
		return err
	}
	return c.validateFallback()
}

// validateReplicas checks WithReplicas.
func (c *config) validateReplicas() error {
	switch {
	case c.replicas < 0:
		return fmt.Errorf("%w: WithReplicas(%d): a negative number of replicas", ErrInvalidOption, c.replicas)
	case c.replicas > 0 && c.replicaWait < time.Millisecond:
		return fmt.Errorf("%w: WithReplicas(%d, %v): a wait under 1ms", ErrInvalidOption, c.replicas, c.replicaWait)
	}
	return nil
}

// validateFallback checks WithFallback's instances against the rules.
func (c *config) validateFallback() error {
	switch {
	case !c.fallback:
		return nil
	case c.instances < 1:
		return fmt.Errorf("%w: fallback instances %d, want at least 1", ErrInvalidOption, c.instances)
	case c.noBreaker:
		return fmt.Errorf("%w: WithFallback decides while the breaker is open: WithoutBreaker turns it off", ErrInvalidOption)
	}
	for _, r := range c.rules {
		if r.Limit.Requests < c.instances || r.Limit.Burst != 0 && r.Limit.Burst < c.instances {
			return fmt.Errorf("%w: rule %v cannot be shared by %d fallback instances: each would admit nothing", ErrInvalidOption, r, c.instances)
		}
	}
	return nil
}
