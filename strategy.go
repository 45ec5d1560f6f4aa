package leakybucket

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Strategy is how a Bucket keeps its counts in Redis: Logs (the default),
// SortedSet or Windows(precision). Every strategy answers the same calls
// with the same Results and errors, takes the same lock, and reads time from
// Redis only, so hosts with skewed clocks share one window. They differ in
// what a decision costs as the database grows, in memory, and in exactness:
//
//	strategy            exact              a decision walks         memory per scope
//	Logs                to the ms          the whole database       one key per call in the window
//	SortedSet           to the ms          one sorted set           one member per call in the window
//	Windows(precision)  up to a precision  one or two hashes        one field per precision in the window
//
// Choose Logs for a small, dedicated database and nothing but strings;
// SortedSet when the database is large or shared; Windows when a window
// holds many calls and a bounded error is fine. The README has measured
// figures.
type Strategy interface {
	// String names the strategy, as "sorted set" or "windows(1s)".
	String() string

	// newStore returns the store of a Bucket with these rules, or an
	// ErrInvalidOption error if the strategy cannot keep them.
	newStore(p plan) (store, error)
}

var (
	// Logs writes one expiring key per admitted call (SET PXAT) and counts
	// the live ones with SCAN MATCH. It is exact and needs nothing but
	// strings, but SCAN walks the whole database, so a decision slows down
	// as the database grows: keep the limiter in a logical database of its
	// own. The default.
	Logs Strategy = logsStrategy{}

	// SortedSet keeps one sorted set per scope (the resource when a rule is
	// per-resource, else each (resource, client)), with one member per call
	// scored by Redis time; each write trims members older than the longest
	// window and sets the key to expire after it. It is exact, and a
	// decision costs the same whatever else the database holds.
	SortedSet Strategy = sortedSetStrategy{}
)

// Windows returns the strategy that keeps, per (resource, client) and per
// resource, one hash of the weight admitted in each interval of precision
// (a one-hour window at a precision of one minute is at most 61 fields),
// deleting intervals as they leave the longest window. A decision costs the
// same whatever else the database holds, and memory is bounded by
// window/precision however many calls are made.
//
// A call is counted as if it was made at the end of its interval, so it
// leaves each window up to precision later than it would under Logs: Windows
// never admits a call that Logs would deny, and may deny one for at most
// precision longer (RetryAfter says for how long). Per(1, d) thus spaces
// calls by at least d and at most d+precision.
//
// The precision is kept in whole milliseconds; it must be at least one and
// at most the shortest window of the rules, or New returns ErrInvalidOption.
func Windows(precision time.Duration) Strategy { return windowsStrategy{precision} }

// plan is what the stores need to know of the rules.
type plan struct {
	rules []Rule
	// clientScoped: every rule is per-client, so a decision needs only the
	// (resource, client) lock and that client's counts.
	clientScoped bool
	longest      int64 // the longest window, ms: how long a call is counted
	scanCount    int
}

func newPlan(cfg config) plan {
	p := plan{rules: cfg.rules, clientScoped: true, scanCount: cfg.scanCount}
	for _, r := range cfg.rules {
		p.clientScoped = p.clientScoped && r.Scope == ScopeClient
		p.longest = max(p.longest, r.Limit.windowMillis())
	}
	return p
}

// A store reads and writes one strategy's counts. Every method is called
// with the keys of one resource, and client in clear text. The Bucket calls
// record and forget inside the MULTI/EXEC that releases the lock, after read
// ran under the same lock.
type store interface {
	// read returns the reads of decisions, a Peek or a Flush by clients,
	// which all need the same lock: when every rule is per-client, clients
	// holds one client.
	read(keys keyspace, clients []string) reader
	// stamp returns the time (ms) at which a call made at Redis time now is
	// counted: when it starts to leave the windows, less each window.
	stamp(now int64) int64
	// record queues the writes that count calls of total weight n by
	// client, given what read found and the calls added to t since, these
	// ones included.
	record(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally, n int)
	// forget queues the writes that forget every count of client: its own,
	// and its share of the resource's.
	forget(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally)
	// readAll returns the read of every key of the resource's counts, for
	// FlushAll under the resource's lock (a rule is per-resource).
	readAll(keys keyspace) keysReader
	// countsPrefix is what every key of the resource's counts starts with,
	// for FlushAll without a lock (every rule is per-client).
	countsPrefix(keys keyspace) string
	// tag names the key layout: what a Bucket's counts depend on beyond
	// the strategy (the longest window, a precision). Buckets whose tags
	// differ never share a key, so that one never trims or expires counts
	// that the other still needs.
	tag() string
}

// A keysReader finds keys to delete.
type keysReader interface {
	reader
	keys() []string
}

// A reader reads the counts of one decision.
type reader interface {
	// queue adds the first reads and TIME to a pipeline: the lock's, or
	// Peek's own.
	queue(ctx context.Context, pipe redis.Pipeliner)
	// finish reads what queue's pipeline returned, and whatever else is
	// needed, on conn. If queue was not called, it sends the first reads
	// itself.
	finish(ctx context.Context, conn pipeliner) error
	// tally returns what was read, after finish.
	tally() *tally
}

// pipeliner is a connection: a *redis.Client, or the *redis.Tx that holds
// the lock.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// tally is what a reader found, oldest first once sorted.
type tally struct {
	now  int64                 // Redis time, ms, read after the counts
	all  []logEntry            // the resource's entries: what per-resource rules count
	mine map[string][]logEntry // by encoded client: what per-client rules count

	expiring map[string]bool // keys whose trim and expiry a batch already queued
}

// firstWrite reports whether key gets its first write of the batch: the
// writes that are the same for every client (trimming, the expiry) are
// queued once per key, not once per client.
func (t *tally) firstWrite(key string) bool {
	if t.expiring[key] {
		return false
	}
	if t.expiring == nil {
		t.expiring = map[string]bool{}
	}
	t.expiring[key] = true
	return true
}

func newTally() tally { return tally{mine: map[string][]logEntry{}} }

// of returns the entries of client.
func (t *tally) of(client string) []logEntry { return t.mine[encode(client)] }

// add counts a call by client, the newest, as a store's reads would show
// it after the call was recorded.
func (t *tally) add(client string, e logEntry) {
	t.all = append(t.all, e)
	t.mine[encode(client)] = append(t.mine[encode(client)], e)
}

// sort puts the entries oldest first: the order in which they leave every
// window.
func (t *tally) sort() {
	byTime := func(a, b logEntry) int { return cmp.Compare(a.at, b.at) }
	slices.SortFunc(t.all, byTime)
	for _, entries := range t.mine {
		slices.SortFunc(entries, byTime)
	}
}

// logEntry is one counted call (or, for Windows, one interval's calls).
type logEntry struct {
	id     string // its key, member or field
	client string // base64url, as in the keys; empty for Windows
	at     int64  // when it is counted from (see store.stamp), ms
	weight int
}

// prune removes from *entries those no rule counts any more, which changes
// no count, and returns their ids: so a batch of calls deletes them once.
func (t *tally) prune(entries *[]logEntry, longest int64) []string {
	var ids []string
	*entries = slices.DeleteFunc(*entries, func(e logEntry) bool {
		if e.at+longest > t.now {
			return false
		}
		ids = append(ids, e.id)
		return true
	})
	return ids
}

// sendQueued sends r's first reads on conn unless they were queued
// elsewhere (ready reports whether they were).
func sendQueued(ctx context.Context, conn pipeliner, r reader, ready bool) {
	if ready {
		return
	}
	// Errors are the commands' own: the reader reports them.
	_, _ = conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		r.queue(ctx, pipe)
		return nil
	})
}

func invalidStrategy(s Strategy, format string, args ...any) error {
	return fmt.Errorf("%w: strategy %v: %s", ErrInvalidOption, s, fmt.Sprintf(format, args...))
}
