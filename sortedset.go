package leakybucket

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

type sortedSetStrategy struct{}

func (sortedSetStrategy) String() string { return "sorted set" }

func (sortedSetStrategy) newStore(p plan) (store, error) { return sortedSetStore{p}, nil }

// sortedSetStore is the SortedSet strategy: the sliding log of the classic
// Redis limiters, one member per call scored by Redis time, without their
// script. One set per scope serves every rule, as one log does under Logs:
// the resource's set (members carry their client, for per-client rules and
// Flush) when a rule is per-resource, else one set per client.
type sortedSetStore struct{ plan }

func (s sortedSetStore) key(keys keyspace, client string) string {
	if s.clientScoped {
		return keys.clientSortedSet(client)
	}
	return keys.sortedSet()
}

func (s sortedSetStore) read(keys keyspace, clients []string) reader {
	return &sortedSetRead{key: s.key(keys, clients[0]), t: newTally()}
}

func (sortedSetStore) stamp(now int64) int64 { return now }

// record trims the members no window counts, adds the call, and sets the
// set to expire with its newest member. The set holds at most the calls of
// the longest window, so reading it all costs what the rules allow.
func (s sortedSetStore) record(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally, n int) {
	key := s.key(keys, client)
	first := t.firstWrite(key)
	if first {
		pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(t.now-s.longest, 10))
	}
	member := encode(client) + ":" + strconv.Itoa(n) + ":" + uuid.NewString()
	pipe.ZAdd(ctx, key, redis.Z{Score: float64(t.now), Member: member})
	if first {
		// After the ZADD: PEXPIREAT does nothing to a key not yet made.
		pipe.PExpireAt(ctx, key, time.UnixMilli(t.now+s.longest))
	}
}

func (s sortedSetStore) forget(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally) {
	switch {
	case s.clientScoped:
		pipe.Del(ctx, s.key(keys, client))
	case len(t.of(client)) > 0:
		pipe.ZRem(ctx, s.key(keys, client), toAny(ids(t.of(client)))...)
	}
}

// readAll needs no SCAN: with a per-resource rule, the resource's one set
// holds every count.
func (sortedSetStore) readAll(keys keyspace) keysReader { return fixedKeys{keys.sortedSet()} }

// countsPrefix is that of the clients' sets, one per client when every
// rule is per-client.
func (sortedSetStore) countsPrefix(keys keyspace) string { return keys.clientSortedSet("") }

func (s sortedSetStore) tag() string { return "w" + strconv.FormatInt(s.longest, 10) }

// sortedSetRead reads a whole set and TIME in one round trip.
type sortedSetRead struct {
	key string

	members *redis.ZSliceCmd
	clock   *redis.TimeCmd
	t       tally
}

func (r *sortedSetRead) queue(ctx context.Context, pipe redis.Pipeliner) {
	r.members = pipe.ZRangeWithScores(ctx, r.key, 0, -1)
	r.clock = pipe.Time(ctx)
}

func (r *sortedSetRead) finish(ctx context.Context, conn pipeliner) error {
	sendQueued(ctx, conn, r, r.clock != nil)
	members, err := r.members.Result()
	if err != nil {
		return err
	}
	now, err := r.clock.Result()
	if err != nil {
		return err
	}
	r.t.now = now.UnixMilli()
	for _, z := range members {
		e, ok := parseMember(z)
		if !ok {
			continue
		}
		r.t.all = append(r.t.all, e)
		r.t.mine[e.client] = append(r.t.mine[e.client], e)
	}
	return nil
}

func (r *sortedSetRead) tally() *tally { return &r.t }

// parseMember reads a member C:<n>:<uuid>; anything else is not ours.
func parseMember(z redis.Z) (logEntry, bool) {
	member, ok := z.Member.(string)
	if !ok {
		return logEntry{}, false
	}
	parts := strings.Split(member, ":")
	if len(parts) != 3 {
		return logEntry{}, false
	}
	weight, err := strconv.Atoi(parts[1])
	if err != nil || weight <= 0 {
		return logEntry{}, false
	}
	return logEntry{id: member, client: parts[0], at: int64(z.Score), weight: weight}, true
}

func toAny(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
