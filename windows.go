package leakybucket

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

type windowsStrategy struct{ precision time.Duration }

func (w windowsStrategy) String() string { return "windows(" + w.precision.String() + ")" }

func (w windowsStrategy) newStore(p plan) (store, error) {
	if w.precision < time.Millisecond {
		return nil, invalidStrategy(w, "precision under 1ms")
	}
	for _, r := range p.rules {
		if r.Limit.Window < w.precision {
			return nil, invalidStrategy(w, "precision longer than the window of rule %v", r)
		}
	}
	return windowsStore{plan: p, precision: w.precision.Milliseconds()}, nil
}

// windowsStore is the Windows strategy: precision-bucket sliding windows.
// Each hash maps an interval (Redis time / precision) to the weight admitted
// in it, and one hash serves every rule: a rule counts the intervals whose
// end is inside its window. The client's hash is kept even when every rule
// is per-resource, so that Flush knows the client's share.
type windowsStore struct {
	plan
	precision int64 // ms
}

func (s windowsStore) read(keys keyspace, clients []string) reader {
	r := &windowsRead{precision: s.precision, clients: map[string]string{}, t: newTally()}
	for _, c := range clients {
		r.clients[encode(c)] = keys.clientHash(c)
	}
	if !s.clientScoped {
		r.resource = keys.hash()
	}
	return r
}

// stamp is the last millisecond of now's interval: every call of an
// interval counts as made then, so none leaves a window early.
func (s windowsStore) stamp(now int64) int64 { return (now/s.precision+1)*s.precision - 1 }

// record adds n to now's interval, deletes intervals no window counts, and
// sets the hash to expire with now's interval.
func (s windowsStore) record(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally, n int) {
	field := strconv.FormatInt(t.now/s.precision, 10)
	expireAt := time.UnixMilli(s.stamp(t.now) + s.longest)
	add := func(key string, entries *[]logEntry) {
		if dead := t.prune(entries, s.longest); len(dead) > 0 {
			pipe.HDel(ctx, key, dead...)
		}
		// The entries hold this call already (see store.record): a sum
		// capped at MaxInt64 means HINCRBY would overflow and fail.
		if s.weightAt(*entries, t.now) == math.MaxInt64 {
			pipe.HSet(ctx, key, field, int64(math.MaxInt64))
		} else {
			pipe.HIncrBy(ctx, key, field, int64(n))
		}
		if t.firstWrite(key) {
			pipe.PExpireAt(ctx, key, expireAt)
		}
	}
	mine := t.of(client)
	add(keys.clientHash(client), &mine)
	t.mine[encode(client)] = mine
	if !s.clientScoped {
		add(keys.hash(), &t.all)
	}
}

// forget deletes the client's hash and takes its weights out of the
// resource's.
func (s windowsStore) forget(ctx context.Context, pipe redis.Pipeliner, keys keyspace, client string, t *tally) {
	pipe.Del(ctx, keys.clientHash(client))
	if s.clientScoped || len(t.of(client)) == 0 {
		return
	}
	for _, e := range t.of(client) {
		if weight(t.all, e.id) <= int64(e.weight) {
			pipe.HDel(ctx, keys.hash(), e.id)
		} else {
			pipe.HIncrBy(ctx, keys.hash(), e.id, -int64(e.weight))
		}
	}
	// FlushAll takes the same lock, so the hash read is the hash written:
	// HINCRBY never makes a new one with a negative count.
}

func (s windowsStore) readAll(keys keyspace) keysReader {
	return newKeyScan(s.countsPrefix(keys), s.scanCount)
}

// countsPrefix is that of the resource's hash and of every client's.
func (windowsStore) countsPrefix(keys keyspace) string { return keys.hash() }

// tag carries the precision too: hashes of different precisions number
// their intervals differently.
func (s windowsStore) tag() string {
	return "w" + strconv.FormatInt(s.longest, 10) + "p" + strconv.FormatInt(s.precision, 10)
}

// weight returns the weight of the interval field among entries as read.
func weight(entries []logEntry, field string) int64 {
	for _, e := range entries {
		if e.id == field {
			return int64(e.weight)
		}
	}
	return 0
}

// weightAt returns the weight of now's interval among entries, the calls
// added since the read included.
func (s windowsStore) weightAt(entries []logEntry, now int64) int64 {
	var sum int64
	for _, e := range entries {
		if e.at != s.stamp(now) {
			continue
		}
		if sum > math.MaxInt64-int64(e.weight) {
			return math.MaxInt64
		}
		sum += int64(e.weight)
	}
	return sum
}

// windowsRead reads the hashes and TIME in one round trip.
type windowsRead struct {
	precision int64
	resource  string            // empty when every rule is per-client
	clients   map[string]string // the client hashes, by encoded client

	all   *redis.MapStringStringCmd
	mine  map[string]*redis.MapStringStringCmd
	clock *redis.TimeCmd
	t     tally
}

func (r *windowsRead) queue(ctx context.Context, pipe redis.Pipeliner) {
	if r.resource != "" {
		r.all = pipe.HGetAll(ctx, r.resource)
	}
	r.mine = map[string]*redis.MapStringStringCmd{}
	for client, key := range r.clients {
		r.mine[client] = pipe.HGetAll(ctx, key)
	}
	r.clock = pipe.Time(ctx)
}

func (r *windowsRead) finish(ctx context.Context, conn pipeliner) error {
	sendQueued(ctx, conn, r, r.clock != nil)
	now, err := r.clock.Result()
	if err != nil {
		return err
	}
	r.t.now = now.UnixMilli()
	for client, cmd := range r.mine {
		if r.t.mine[client], err = r.intervals(cmd); err != nil {
			return err
		}
	}
	if r.all != nil {
		r.t.all, err = r.intervals(r.all)
	}
	return err
}

// intervals reads a hash as one entry per interval, stamped at its end.
// Fields that are not an interval of positive weight are not ours.
func (r *windowsRead) intervals(cmd *redis.MapStringStringCmd) ([]logEntry, error) {
	fields, err := cmd.Result()
	if err != nil {
		return nil, err
	}
	entries := make([]logEntry, 0, len(fields))
	for field, value := range fields {
		index, err := strconv.ParseInt(field, 10, 64)
		if err != nil || index < 0 {
			continue
		}
		weight, err := strconv.Atoi(value)
		if err != nil || weight <= 0 {
			continue
		}
		entries = append(entries, logEntry{id: field, at: (index+1)*r.precision - 1, weight: weight})
	}
	return entries, nil
}

func (r *windowsRead) tally() *tally { return &r.t }
