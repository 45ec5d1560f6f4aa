package leakybucket

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// parseLog reads a key found under logs (the resource's log prefix). A key
// that does not have the shape of a log is not one of ours and is skipped.
func parseLog(key, logs string) (logEntry, bool) {
	rest, ok := strings.CutPrefix(key, logs)
	if !ok {
		return logEntry{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 4 {
		return logEntry{}, false
	}
	at, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return logEntry{}, false
	}
	weight, err := strconv.Atoi(parts[2])
	if err != nil || weight <= 0 {
		return logEntry{}, false
	}
	return logEntry{id: key, client: parts[0], at: at, weight: weight}, true
}

type logsStrategy struct{}

func (logsStrategy) String() string { return "logs" }

func (logsStrategy) newStore(p plan) (store, error) { return logsStore{p}, nil }

// logsStore is the Logs strategy: one key per call, counted with SCAN.
type logsStore struct{ plan }

// read scans the client's own logs when every rule is per-client, else the
// whole resource's.
func (s logsStore) read(keys keyspace, clients []string) reader {
	prefix := keys.logs()
	if s.clientScoped {
		prefix = keys.clientLogs(clients[0])
	}
	return &logScan{
		logs:  keys.logs(),
		match: matchPrefix(prefix),
		count: int64(s.scanCount),
		seen:  map[string]struct{}{},
		t:     newTally(),
	}
}

func (logsStore) stamp(now int64) int64 { return now }

func (s logsStore) record(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally, n int) {
	pipe.Do(ctx, "set", keys.newLog(client, t.now, n), "", "pxat", t.now+s.longest)
}

func (logsStore) forget(ctx context.Context, pipe redis.Pipeliner, _ keyspace, client string, t *tally) {
	if ids := ids(t.of(client)); len(ids) > 0 {
		pipe.Del(ctx, ids...)
	}
}

func (s logsStore) readAll(keys keyspace) keysReader {
	return newKeyScan(s.countsPrefix(keys), s.scanCount)
}

func (logsStore) countsPrefix(keys keyspace) string { return keys.logs() }

func (s logsStore) tag() string { return "w" + strconv.FormatInt(s.longest, 10) }

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
			s.t.mine[e.client] = append(s.t.mine[e.client], e)
		}
	}
	s.cursor, s.t.now = cursor, now.UnixMilli()
	return cursor == 0, nil
}

func (s *logScan) tally() *tally { return &s.t }

// ids returns the ids of entries.
func ids(entries []logEntry) []string {
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.id
	}
	return ids
}

// deleteKeys deletes every key under prefix, found with SCAN (keyScan).
func deleteKeys(ctx context.Context, node *redis.Client, prefix string, count int) error {
	r := newKeyScan(prefix, count)
	if err := r.finish(ctx, node); err != nil || len(r.found) == 0 {
		return err
	}
	return node.Del(ctx, r.found...).Err()
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
	return &keyScan{match: matchPrefix(prefix), count: int64(count), seen: map[string]struct{}{}, t: newTally()}
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

func (s *keyScan) keys() []string { return s.found }

// fixedKeys is a keysReader of keys known without a read.
type fixedKeys []string

func (fixedKeys) queue(context.Context, redis.Pipeliner) {}

func (fixedKeys) finish(context.Context, pipeliner) error { return nil }

func (fixedKeys) tally() *tally {
	t := newTally()
	return &t
}

func (k fixedKeys) keys() []string { return k }
