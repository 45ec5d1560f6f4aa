package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/lock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// parseLog reads a key found under logs (the resource's log prefix) as the
// call it counts; ok is false for a key that is not a log.
func parseLog(key, logs string) (limits.Entry, bool) {
	l, ok := keys.ParseLog(key, logs)
	return limits.Entry{ID: key, Client: l.Client, At: l.At, Weight: l.Weight}, ok
}

// NewLogs returns the store of Logs for p, whose lock is taken as l says.
func NewLogs(p Plan, l Locking) Store { return logsStore{Plan: p, locking: l} }

// logsStore is the Logs strategy: one key per batch of calls of a client,
// counted with SCAN under the lock (package lock).
type logsStore struct {
	Plan
	locking Locking
}

// Locking is how the Logs store takes its lock: its TTL, and the first
// and longest wait between attempts (none: the lock's own).
type Locking struct {
	TTL  time.Duration
	Wait [2]time.Duration
}

// lockKey names the lock of client's decisions at a resource: the
// resource's when a rule is per-resource, else the (resource, client)'s.
func lockKey(ks keys.Space, p Plan, client string) string {
	if p.ClientScoped {
		return ks.ClientLock(client)
	}
	return ks.ResourceLock()
}

// read scans the client's own logs when every rule is per-client, else the
// whole resource's.
func (s logsStore) read(ks keys.Space, client string) *logScan {
	prefix := ks.Logs()
	if s.ClientScoped {
		prefix = ks.ClientLogs(client)
	}
	return &logScan{
		logs:  ks.Logs(),
		match: keys.MatchPrefix(prefix),
		count: int64(s.ScanCount),
		seen:  map[string]struct{}{},
		t:     newTally(),
	}
}

// Decide takes the lock, reads the logs, evaluates the calls in order (each
// seeing the ones recorded before it), and writes one log per client,
// carrying the weight of all its recorded calls, in the EXEC that
// releases the lock. If too few replicas acknowledged that EXEC
// (WithReplicas), its logs are deleted again before the error is
// returned: no call of it is admitted. A log's name is unique, so the
// DEL undoes its write exactly once, wherever it runs (the primary, or
// the replica promoted since, which holds the log or not).
func (s logsStore) Decide(ctx context.Context, where Site, calls []limits.Call, evaluate Evaluate) error {
	client := calls[0].Client // every call's, when every rule is per-client
	var written []string
	err := s.underLock(ctx, where, lockKey(where.Keys, s.Plan, client), s.read(where.Keys, client), where.Acks, func(w *txn.Txn, t *tally) {
		t.sort()
		weights := map[string]int{}
		for i, c := range calls {
			// Under the lock the room is what was read: a call AtMost
			// writes only its Weight.
			v := t.view(s.Rules, c.Client, t.now)
			if n := c.Weight(s.Rules, v.Counts); evaluate(i, v) {
				t.add(c.Client, limits.Entry{At: t.now, Weight: n})
				weights[c.Client] = limits.AddCapped(weights[c.Client], n)
			}
		}
		for client, weight := range weights {
			log := where.Keys.NewLog(client, t.now, weight)
			written = append(written, log)
			w.Add("set", log, "", "pxat", t.now+s.Longest)
		}
	})
	if errors.Is(err, txn.ErrNotReplicated) && len(written) > 0 {
		takeBack(where, &txn.Txn{Cmds: [][]any{del(written)}}, true)
	}
	return err
}

// del is DEL of keys.
func del(keys []string) []any {
	cmd := make([]any, 0, 1+len(keys))
	cmd = append(cmd, "del")
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	return cmd
}

// Peek scans without the lock: one round trip when the SCAN fits in one
// page.
func (s logsStore) Peek(ctx context.Context, where Site, client string, _ int) (limits.View, error) {
	r := s.read(where.Keys, client)
	if err := r.finish(ctx, where.conn()); err != nil {
		return limits.View{}, err
	}
	r.t.sort()
	return r.t.view(s.Rules, client, r.t.now), nil
}

// Flush deletes the client's logs under the lock.
func (s logsStore) Flush(ctx context.Context, where Site, client string) error {
	return s.underLock(ctx, where, lockKey(where.Keys, s.Plan, client), s.read(where.Keys, client), txn.Acks{}, func(w *txn.Txn, t *tally) {
		if ids := ids(t.of(client)); len(ids) > 0 {
			w.Add(del(ids)...)
		}
	})
}

// FlushAll deletes every log of the resource: under the resource's lock
// when a rule is per-resource, so that no decision or Flush runs halfway
// through; when every rule is per-client there is no such lock.
func (s logsStore) FlushAll(ctx context.Context, where Site) error {
	if s.ClientScoped {
		return deleteUnder(ctx, where, where.Keys.Logs(), s.ScanCount)
	}
	r := newKeyScan(where.Keys.Logs(), s.ScanCount)
	return s.underLock(ctx, where, where.Keys.ResourceLock(), r, txn.Acks{}, func(w *txn.Txn, _ *tally) {
		if len(r.found) > 0 {
			w.Add(del(r.found)...)
		}
	})
}

// Line is the lock's: the calls of one lock are decided together.
func (s logsStore) Line(ks keys.Space, client string) string { return lockKey(ks, s.Plan, client) }

func (logsStore) Locked() bool { return true }

func (s logsStore) Tag() string { return "w" + strconv.FormatInt(s.Longest, 10) }

// logScan counts the logs under one prefix with SCAN MATCH. SCAN walks the
// whole database COUNT keys at a time and may return a key twice, so it runs
// until the cursor is 0 and keeps each key once.
//
// Each page is pipelined with TIME, and the decision takes the time of the
// last page, read after the iteration ended. A log still alive then was
// alive during the whole iteration, so SCAN returned it; a log that expired
// during the iteration may or may not be returned, but the rules would not
// count it at that time anyway. So the count is exact at that instant.
type logScan struct {
	logs  string // the resource's log prefix, to parse keys
	match string
	count int64

	cursor uint64
	page   *redis.ScanCmd // the queued page, until absorbed
	clock  *redis.TimeCmd
	queued bool

	seen map[string]struct{}
	t    tally
}

func (s *logScan) queue(ctx context.Context, pipe redis.Pipeliner) {
	s.page = pipe.Scan(ctx, s.cursor, s.match, s.count)
	s.clock = pipe.Time(ctx)
	s.queued = true
}

func (s *logScan) finish(ctx context.Context, conn pipeliner) error {
	sendQueued(ctx, conn, s, s.queued)
	for {
		done, err := s.absorb()
		if err != nil || done {
			return err
		}
		sendQueued(ctx, conn, s, false)
	}
}

// absorb reads the queued page after its pipeline ran, and reports whether
// it was the last.
func (s *logScan) absorb() (bool, error) {
	keys, cursor, err := s.page.Result()
	if err != nil {
		return false, err
	}
	now, err := s.clock.Result()
	if err != nil {
		return false, err
	}
	for _, key := range keys {
		if _, dup := s.seen[key]; dup {
			continue
		}
		s.seen[key] = struct{}{}
		if e, ok := parseLog(key, s.logs); ok {
			s.t.all = append(s.t.all, e)
			s.t.mine[e.Client] = append(s.t.mine[e.Client], e)
		}
	}
	s.cursor, s.t.now = cursor, now.UnixMilli()
	return cursor == 0, nil
}

func (s *logScan) tally() *tally { return &s.t }

// ids returns the ids of entries.
func ids(entries []limits.Entry) []string {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	return ids
}

// underLock runs a read-then-write of the logs under the lock key (see
// package lock): r's reads, then write's commands with the release, which
// acks replicas must acknowledge.
func (s logsStore) underLock(ctx context.Context, where Site, key string, r reader, acks txn.Acks, write func(*txn.Txn, *tally)) error {
	view := where.Lock
	if view == nil {
		view = &lock.View{}
	}
	o := lock.Options{TTL: s.locking.TTL, Clock: where.Clock, Holders: where.Holders, Acks: acks}
	if s.locking.Wait[0] > 0 {
		o.Retry = backoff.Jittered(s.locking.Wait[0], s.locking.Wait[1])
	}
	return lock.Run(ctx, where.Node, key, o, view, section{r: r, write: write})
}

// section is a read-then-write of the logs, as the lock runs it.
type section struct {
	r     reader
	write func(*txn.Txn, *tally)
}

func (s section) Read(ctx context.Context, pipe redis.Pipeliner) { s.r.queue(ctx, pipe) }
func (s section) Finish(ctx context.Context, tx *redis.Tx) error { return s.r.finish(ctx, tx) }
func (s section) Write(t *txn.Txn)                               { s.write(t, s.r.tally()) }

// A reader reads the counts of one decision under the lock.
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

// keyScan finds every key under a prefix with SCAN, page by page, each key
// once.
type keyScan struct {
	match string
	count int64

	cursor uint64
	page   *redis.ScanCmd
	found  []string
	seen   map[string]struct{}
	t      tally
}

func newKeyScan(prefix string, count int) *keyScan {
	return &keyScan{match: keys.MatchPrefix(prefix), count: int64(count), seen: map[string]struct{}{}, t: newTally()}
}

func (s *keyScan) queue(ctx context.Context, pipe redis.Pipeliner) {
	s.page = pipe.Scan(ctx, s.cursor, s.match, s.count)
}

func (s *keyScan) finish(ctx context.Context, conn pipeliner) error {
	sendQueued(ctx, conn, s, s.page != nil)
	for {
		keys, cursor, err := s.page.Result()
		if err != nil {
			return err
		}
		for _, key := range keys {
			if _, dup := s.seen[key]; !dup {
				s.seen[key] = struct{}{}
				s.found = append(s.found, key)
			}
		}
		if s.cursor = cursor; cursor == 0 {
			return nil
		}
		sendQueued(ctx, conn, s, false)
	}
}

func (s *keyScan) tally() *tally { return &s.t }

// deleteUnder deletes every key under prefix, found with SCAN (keyScan),
// and then checks that the node still owns the slot (on a cluster, a SCAN
// of a node that lost it finds nothing).
func deleteUnder(ctx context.Context, where Site, prefix string, count int) error {
	r := newKeyScan(prefix, count)
	if err := r.finish(ctx, where.Node); err != nil {
		return err
	}
	if len(r.found) > 0 {
		if err := where.Node.Del(ctx, r.found...).Err(); err != nil {
			return err
		}
	}
	return where.Route.owns(ctx, where.Node, where.Keys)
}
