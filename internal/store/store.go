// Package store keeps the counts of a Bucket's strategies in Redis.
// SortedSet and Windows decide a batch in one MULTI/EXEC without a lock,
// and take back in a second one the weight written for calls then denied;
// Logs decides under the script-free lock (package lock). Each store says
// what the batcher needs of it (Store), and the root package chooses one
// by the Bucket's strategy.
package store

import (
	"context"
	"hash/maphash"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/lock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// A Plan is what the stores need to know of a Bucket's rules and options.
type Plan struct {
	Rules []limits.Rule // the Bucket's, in order
	// ClientScoped: every rule is per-client, so a decision needs only the
	// client's counts (and, under Logs, only the (resource, client) lock).
	ClientScoped  bool
	HasClientRule bool
	Longest       int64 // the longest window, ms: how long a call is counted
	RecordDenied  bool
	ScanCount     int // the COUNT of the SCANs that find a resource's keys
}

// A Store keeps one strategy's counts: its Redis commands live in its own
// file. Every method works on one resource's site, and takes clients in
// clear text.
type Store interface {
	// Decide decides calls, in order, and records them: for each it calls
	// evaluate with what every rule counted before it, and records the call if
	// evaluate says so (see Evaluate).
	Decide(ctx context.Context, where Site, calls []limits.Call, evaluate Evaluate) error
	// Peek returns what every rule counts for client, for a call of
	// weight n, without writing anything.
	Peek(ctx context.Context, where Site, client string, n int) (limits.View, error)
	// Flush forgets every count of client: its own, and its share of the
	// resource's.
	Flush(ctx context.Context, where Site, client string) error
	// FlushAll forgets every count of the resource.
	FlushAll(ctx context.Context, at Site) error
	// Tag names the key layout: what a Bucket's counts depend on beyond
	// the strategy (the longest window, a precision). Buckets whose tags
	// differ never share a key, so that one never trims or expires counts
	// that the other still needs.
	Tag() string
	// Line names the calls one batch may hold: those decided under one
	// lock (Logs), or in one transaction of the resource's keys.
	Line(ks keys.Space, client string) string
	// Locked reports whether decisions take a lock. Then a line runs one
	// batch at a time, and no call needs to only look (package foresight):
	// the lock lets no other decision count a call before it is evaluated.
	Locked() bool
}

// lockFree is what SortedSet and Windows share: every batch of a line is
// one transaction of its resource's keys, without a lock. clientScoped is
// Plan.ClientScoped.
type lockFree struct{ clientScoped bool }

// clientLines is how many lines the calls to one resource queue in when
// every rule is per-client.
const clientLines = 2

// lineSeed hashes clients to their lines: any seed will do, as long as
// a process keeps it.
var lineSeed = maphash.MakeSeed()

// Line is where a call queues: a line decides one batch at a time, as two
// batches under way at once would each count weight that the other then
// takes back, and deny calls on it (package batch). So the calls to a
// resource share one line; but where every rule is per-client, no call
// counts what another client's call writes, and a resource's clients are
// split among clientLines lines by a hash of the client. Then one line's
// batch runs in Redis while another's is built and judged here, where one
// line leaves Redis idle while its batch is judged, and this process idle
// while Redis runs it (the bench's steady table, 10 000 clients of one
// resource, Windows(50ms): 1.18-1.33x redis_rate's decisions/s with two
// lines, 1.00-1.08x with one; four made each batch a quarter as large,
// Redis's CPU per decision higher and p99 1.5x redis_rate's). A client's
// calls always share a line.
func (l lockFree) Line(ks keys.Space, client string) string {
	if !l.clientScoped || maphash.String(lineSeed, client)%clientLines == 0 {
		return ks.Slot()
	}
	return ks.Slot() + "1" // no Slot ends so: each ends with "}:"
}

func (lockFree) Locked() bool { return false }

// Evaluate says whether call i of a batch is to be recorded, given v,
// what every rule counted before it: admitted (or denied, with
// WithRecordDenied), and its caller still waiting. It only evaluates: what
// else follows from the verdict is the caller's, once Decide returns. A
// store calls it once per call, in order. v's slices are the store's,
// valid only during the call: an Evaluate copies what it keeps.
type Evaluate func(i int, v limits.View) (record bool)

// Site is where one resource's counts live: the node that owns them, and
// what is known of it.
type Site struct {
	Node  *redis.Client
	Keys  keys.Space
	Clock *clock.Clock // the node's clock
	Route *ClusterRoute
	Lock  *lock.View // what this process knows of the resource's lock (Logs)
	// Holders give the turns to take locks on the node (Logs).
	Holders *lock.Holders
	// Markers names the markers of the Bucket's transactions (see
	// txn.Markers); nil names each its own.
	Markers *txn.Markers
	// Carry holds take-backs for the next transaction of the batch's
	// line, while busy says calls wait in it; nil outside a batch.
	Carry *Carried
	Busy  func() bool
	// Ahead holds urgent take-backs for the batch's next decision, which
	// decides their calls again (see txn.Txn.Urgent); nil outside a batch.
	Ahead *Carried
	// Refind looks up the node that owns the keys again, after a
	// redirect.
	Refind func(context.Context) (*redis.Client, error)
	// Acks: how many of the node's replicas must acknowledge a decision's
	// writes before any of its calls is admitted (WithReplicas), and by
	// when; zero outside a batch, and for Peek, Flush and FlushAll, whose
	// writes only ever lower a count.
	Acks txn.Acks
}

// conn is node as the connection of reads that carry no key: on a cluster,
// guarded so that they fail where the node does not own the slot.
func (s Site) conn() pipeliner { return s.Route.conn(s.Node, s.Keys) }

// pipeliner is a connection: a *redis.Client, or the *redis.Tx that holds
// the lock.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}
