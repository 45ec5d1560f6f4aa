package leakybucket

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Key layout. For prefix P, resource r and client c, with R and C their
// unpadded base64url encodings:
//
//	P:{R}:log:C:<ms>:<n>:<uuid>   one admitted call of weight n, made at Redis
//	                              time <ms>; it expires (PXAT) when the longest
//	                              window has passed
//	P:{R}:lock                    the lock of a Bucket with a per-resource rule
//	P:{R}:lock:C                  the lock of a Bucket whose rules are all per-client
//
// Why this shape:
//   - The hash tag {R} puts every key of a resource in one cluster slot, so
//     the lock, the logs, WATCH and MULTI/EXEC of a decision never cross
//     slots.
//   - base64url has no ':', no brace and no glob metacharacter. So the tag
//     always ends where R ends, the encoding of (resource, client) is
//     injective whatever bytes they hold, and a MATCH pattern for one client
//     (P:{R}:log:C:*) cannot match another client's logs.
//   - "log:" and "lock" differ before either pattern's '*', so no log pattern
//     matches a lock.
//   - The prefix may hold glob metacharacters: matchPrefix escapes them. It
//     cannot hold braces (New refuses them), or the tag would move.
//
// One log per admitted call, stamped with Redis time, serves every rule: a
// rule with window w counts the logs stamped after now-w, where now is also
// Redis time. So no client clock is involved, and the decision is exact to
// the millisecond whatever the rules' windows.

// keyspace names the keys of one resource.
type keyspace struct {
	base string // P:{R}:
}

func resourceKeys(prefix, resource string) keyspace {
	return keyspace{base: prefix + ":{" + encode(resource) + "}:"}
}

func encode(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// slotKey is a key in the resource's slot, to find the node that owns it.
func (k keyspace) slotKey() string { return k.base }

func (k keyspace) resourceLock() string { return k.base + "lock" }

func (k keyspace) clientLock(client string) string { return k.base + "lock:" + encode(client) }

// logs is the prefix of every log of the resource.
func (k keyspace) logs() string { return k.base + "log:" }

// clientLogs is the prefix of the logs of one client of the resource.
func (k keyspace) clientLogs(client string) string { return k.logs() + encode(client) + ":" }

// newLog names the log of a call of weight n by client, admitted at Redis
// time at (ms).
func (k keyspace) newLog(client string, at int64, n int) string {
	return k.clientLogs(client) + strconv.FormatInt(at, 10) + ":" + strconv.Itoa(n) + ":" + uuid.NewString()
}

// logEntry is what a log's name says.
type logEntry struct {
	client string // base64url, as in the key
	at     int64  // Redis time of admission, ms
	weight int
}

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
	return logEntry{client: parts[0], at: at, weight: weight}, true
}

// matchPrefix returns the MATCH pattern of every key that starts with
// prefix, taken literally: Redis glob metacharacters are escaped.
func matchPrefix(prefix string) string {
	var b strings.Builder
	b.Grow(len(prefix) + 2)
	for i := 0; i < len(prefix); i++ {
		switch c := prefix[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('*')
	return b.String()
}

// pipeliner is what logScan needs of a connection: a *redis.Client, or the
// *redis.Tx that holds the lock.
type pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

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
	done   bool

	seen    map[string]struct{}
	entries []logEntry
	now     int64 // Redis time in ms after the last page
}

// newLogScan returns a scan of the logs under prefix, which is the
// resource's log prefix or a client's.
func newLogScan(keys keyspace, prefix string, count int) *logScan {
	return &logScan{logs: keys.logs(), match: matchPrefix(prefix), count: int64(count), seen: map[string]struct{}{}}
}

// queue adds the next page and the time to a pipeline.
func (s *logScan) queue(ctx context.Context, pipe redis.Pipeliner) {
	s.page = pipe.Scan(ctx, s.cursor, s.match, s.count)
	s.clock = pipe.Time(ctx)
}

// absorb reads the queued page after its pipeline ran.
func (s *logScan) absorb() error {
	keys, cursor, err := s.page.Result()
	if err != nil {
		return err
	}
	now, err := s.clock.Result()
	if err != nil {
		return err
	}
	s.page, s.clock = nil, nil
	for _, key := range keys {
		if _, dup := s.seen[key]; dup {
			continue
		}
		s.seen[key] = struct{}{}
		if e, ok := parseLog(key, s.logs); ok {
			s.entries = append(s.entries, e)
		}
	}
	s.cursor, s.now, s.done = cursor, now.UnixMilli(), cursor == 0
	return nil
}

// finish absorbs the page queued by the caller, if any, and reads the rest.
func (s *logScan) finish(ctx context.Context, conn pipeliner) error {
	for {
		if s.page != nil {
			if err := s.absorb(); err != nil {
				return err
			}
			if s.done {
				return nil
			}
		}
		// Errors are the commands' own: absorb reports them.
		_, _ = conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			s.queue(ctx, pipe)
			return nil
		})
	}
}

// deleteLogs deletes every key under prefix, deleting each SCAN page in the
// round trip that fetches the next one.
func deleteLogs(ctx context.Context, node *redis.Client, prefix string, count int) error {
	match := matchPrefix(prefix)
	var cursor uint64
	var found []string
	for {
		var page *redis.ScanCmd
		_, err := node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			if len(found) > 0 {
				pipe.Del(ctx, found...)
			}
			page = pipe.Scan(ctx, cursor, match, int64(count))
			return nil
		})
		if err != nil {
			return err
		}
		found, cursor = page.Val()
		if cursor == 0 {
			break
		}
	}
	if len(found) == 0 {
		return nil
	}
	return node.Del(ctx, found...).Err()
}
