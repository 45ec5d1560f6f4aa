package leakybucket

import (
	"errors"

	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/lock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// Errors returned by New and by the Bucket's methods. Match them with
// errors.Is: most are wrapped with detail, and ErrLockNotObtained is joined
// with the cause (such as context.DeadlineExceeded).
//
// A request the rules deny is not an error: it is a Result with Allowed false.
var (
	// ErrInvalidOption: the options, rules included, are missing or out of
	// range, and the text says which: no rule (neither PerResource nor
	// PerClient); a rule's Limit with Requests <= 0 or a Window under one
	// millisecond; a precision, a Limit's or the Windows strategy's, under
	// one millisecond, longer than the window of a rule that counts in it,
	// or more than 2^22 intervals of that window, or a Limit's Precision
	// under a strategy other than Windows; an empty prefix or one with a
	// brace; a lock TTL under a millisecond; lock waits that are negative
	// or whose first exceeds the longest; a SCAN COUNT below 1; a nil
	// strategy; an empty tier name; WithFallback's instances out of range.
	ErrInvalidOption = errors.New("leakybucket: invalid option")

	// ErrUnsupportedClient: New was given a nil client, or a
	// redis.UniversalClient that is not a *redis.Client, *redis.ClusterClient
	// or *redis.Ring (the Bucket must pin one connection to the node that
	// owns a resource's keys).
	ErrUnsupportedClient = errors.New("leakybucket: unsupported redis client: want *redis.Client, *redis.ClusterClient or *redis.Ring")

	// ErrInvalidWeight: n is not positive; or, for WaitN only, n is larger
	// than the Requests of a rule, so that no wait would ever admit the
	// call. AllowN and PeekN answer such a weight with a denied Result
	// whose RetryAfter is Never, not with an error.
	ErrInvalidWeight = errors.New("leakybucket: invalid weight")

	// ErrNilResult: AllowNInto was given no Result to write in.
	ErrNilResult = errors.New("leakybucket: AllowNInto with a nil *Result")

	// ErrEmptyResource: the resource is the empty string.
	ErrEmptyResource = errors.New("leakybucket: empty resource")

	// ErrEmptyClient: the client is the empty string and the Bucket has a
	// per-client rule.
	ErrEmptyClient = errors.New("leakybucket: empty client with a per-client rule")

	// ErrLockNotObtained: real contention. The lock guarding the decision
	// was seen held by another holder until the context ended or the retry
	// strategy gave up. Nothing was recorded. (A call whose context ends
	// while Redis is slow or unreachable gets its context's error, or
	// ErrUnavailable, not this one.)
	ErrLockNotObtained = lock.ErrNotObtained

	// ErrUnavailable: Redis could not serve the decision durably. It could
	// not be reached or did not answer: a connection refused or reset, an
	// I/O timeout, a pool that cannot connect. The cause stays in the
	// chain, so errors.Is(err, syscall.ECONNREFUSED) and the like hold, and
	// the text names it. Whether a write sent before the failure was
	// applied is unknown; it can only have counted a call, never let one
	// through uncounted. Or, WithReplicas, it answered, but too few of its
	// replicas acknowledged the decision in time: then the error matches
	// ErrNotReplicated too.
	ErrUnavailable = breaker.ErrUnavailable

	// ErrNotReplicated: WithReplicas, the decision ran on the server but
	// fewer of its replicas than asked had acknowledged its writes when
	// the wait ended (a replica lags, is paused or gone, the server has
	// fewer replicas, or the call's deadline left no time to wait), or
	// WAIT itself failed (its error, such as NOPERM, is in the chain). No
	// call of that decision was admitted, and its writes were taken back.
	// It always comes with ErrUnavailable: match either. It never opens
	// the breaker: the server itself answers. WithFallback, the call gets
	// no error: the fallback decides it in process.
	ErrNotReplicated = txn.ErrNotReplicated

	// ErrLockExpired: the lock expired (or changed hands) before the decision
	// was written, so the write was refused and nothing was recorded. It
	// means the lock TTL is shorter than a decision takes (a slow SCAN of a
	// large database, a long pause of the process): raise WithLockTTL.
	ErrLockExpired = lock.ErrExpired
)
