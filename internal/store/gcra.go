package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// NewGCRA returns the store of GCRA for p.
func NewGCRA(p Plan) Store {
	s := gcraStore{Plan: p, lockFree: lockFree{clientScoped: p.ClientScoped}}
	for _, r := range p.Rules {
		b := limits.BucketOf(r)
		s.buckets = append(s.buckets, b)
		// In base 36, and short: a key's name is most of what a bucket
		// costs Redis (MEMORY USAGE 88 B with a name of up to 44
		// characters, 104 B beyond, on Redis 7.0: the value, a small
		// integer, lives in the key's object).
		s.names = append(s.names, strconv.FormatInt(b.Window, 36)+"."+strconv.FormatInt(b.Rate, 36)+"."+strconv.FormatInt(int64(b.Burst), 36))
	}
	return s
}

// gcraStore is the GCRA strategy: a leaky bucket per rule and scope, each
// one exact TAT (limits.Bucket), kept as a key that Redis drops once the
// bucket is empty: the key's expiry X is the last ms at which the bucket
// holds anything, and its value v the fraction of the next ms already
// drained, in 1/Rate of a ms: TAT = X+1 - v/Rate, v in [0, Rate). So the
// key is there exactly while the bucket is not empty, and a WATCHed key
// that empties aborts the EXEC (Redis 7.0). A batch of a line is decided
// by compare-and-swap, without a script, in two round trips on one
// connection:
//
//  1. WATCH the batch's keys, PEXPIRETIME and GET of each, TIME (now).
//  2. The calls are decided, in order, at now, each on the buckets as the
//     calls before it left them; then MULTI, a SET of each bucket an
//     admitted call changed, EXEC. A bucket that held something at now
//     still does when EXEC runs (at w), or EXEC applies nothing: so its
//     TAT was past w, GCRA's max(TAT, w) is the TAT, and the new one,
//     TAT + cost, is written as it is (SET key v PXAT X, or KEEPTTL if X
//     is unchanged, since a SET of an expiry that is already due deletes
//     the key). A bucket that was empty at now is empty at w, where GCRA
//     counts from w: SET key v PX cost, which Redis counts from its own
//     clock when EXEC runs, however late.
//
// So every admitted call is counted in its buckets as GCRA counts it at
// the time Redis ran its write; and it was decided on what those buckets
// held at now, no later than w, when they held as much or more: the calls
// admitted are calls GCRA admits at the times Redis ran them (it may deny
// one that GCRA at w would admit, by up to the drain between now and w).
//
// One TAT cannot be kept so: a bucket, empty at w, that a cost under a ms
// (a rule faster than one unit per ms) leaves empty before w+1. An expiry
// of w is due at once; so it is kept one ms longer, with v in [Rate,
// 2*Rate) to say so, and a decision reads its TAT as X, rounded up to the
// ms (never less than the bucket holds): at most a ms of drain more, once
// after each time the bucket was empty. A batch whose calls are all
// denied writes nothing and costs one round trip and an UNWATCH. The
// calls are evaluated (Evaluate) only once their write has applied: a
// batch that fails returns its error, and no call of it reads as
// admitted.
type gcraStore struct {
	Plan
	lockFree
	buckets []limits.Bucket // by rule
	names   []string        // by rule: its bucket's part of the key, "W.R.B"
}

// casFirstWait and casLongestWait pace a batch's attempts after its EXEC
// found a key changed: jittered, so that the processes that lost do not
// all come back at once, and short, since the winner's write is done.
const (
	casFirstWait   = 100 * time.Microsecond
	casLongestWait = 4 * time.Millisecond
)

// unwatchTimeout bounds the UNWATCH that cleans a connection before it
// goes back to the pool, whatever the caller's context.
const unwatchTimeout = time.Second

// ErrNoClientBucket: see Bucket.Flush.
var ErrNoClientBucket = fmt.Errorf("leakybucket: %w: GCRA keeps one bucket per per-resource rule, with no client's share in it, and this Bucket has no per-client rule: use FlushAll", errors.ErrUnsupported)

func (s gcraStore) key(ks keys.Space, r int, client string) string {
	k := ks.GCRA() + s.names[r]
	if s.Rules[r].PerClient {
		return keys.Client(k, client)
	}
	return k
}

// Locked: a decision is a compare-and-swap, so no other decision counts a
// call before this one is evaluated, and no call needs to only look.
func (gcraStore) Locked() bool { return true }

func (gcraStore) Tag() string { return "g" }

func (s gcraStore) Decide(ctx context.Context, where Site, calls []limits.Call, evaluate Evaluate) error {
	b := s.newBatch(where.Keys, calls)
	pace := backoff.Jittered(casFirstWait, casLongestWait)
	for {
		done, err := b.attempt(ctx, where)
		if err != nil {
			return err
		}
		if done {
			for i := range calls {
				evaluate(i, b.views[i])
			}
			return nil
		}
		if err := backoff.Sleep(ctx, pace.NextBackoff()); err != nil {
			return err
		}
	}
}

// gcraBatch is one batch's compare-and-swap: its keys, and what each
// attempt reads and decides.
type gcraBatch struct {
	gcraStore
	ks    keys.Space
	calls []limits.Call
	keys  []string     // the distinct keys of the calls' buckets
	keyOf [][]int      // by call, by rule: its bucket's key, in keys
	rate  []int64      // by key: its bucket's Rate
	ttl   []int64      // by key: its expiry read (X), -2 if none
	read  []limits.TAT // by key: its TAT read
	tats  []limits.TAT // by key: as the calls decided leave it at now
	views []limits.View
}

func (s gcraStore) newBatch(ks keys.Space, calls []limits.Call) *gcraBatch {
	b := &gcraBatch{gcraStore: s, ks: ks, calls: calls, keyOf: make([][]int, len(calls)), views: make([]limits.View, len(calls))}
	index := map[string]int{}
	for i, c := range calls {
		b.keyOf[i] = make([]int, len(s.Rules))
		for r := range s.Rules {
			k := s.key(ks, r, c.Client)
			at, ok := index[k]
			if !ok {
				at = len(b.keys)
				index[k] = at
				b.keys, b.rate = append(b.keys, k), append(b.rate, s.buckets[r].Rate)
			}
			b.keyOf[i][r] = at
		}
	}
	b.ttl, b.read, b.tats = make([]int64, len(b.keys)), make([]limits.TAT, len(b.keys)), make([]limits.TAT, len(b.keys))
	return b
}

// attempt makes one compare-and-swap of the batch (see gcraStore). done:
// it applied, or nothing was to write; else a watched key changed.
func (b *gcraBatch) attempt(ctx context.Context, where Site) (done bool, err error) {
	conn := where.Node.Conn()
	defer conn.Close()
	sent := time.Now()
	now, err := b.readOn(ctx, conn, true)
	if err != nil {
		unwatch(ctx, conn)
		return false, err
	}
	where.Clock.Observe(now, sent, time.Now())
	ms := now.UnixMilli()
	if !b.decide(ms) {
		unwatch(ctx, conn)
		return true, nil
	}
	return b.swap(ctx, conn, where, ms)
}

// swap sends, on conn that watches the batch's keys, the transaction that
// writes each TAT b.tats changed since the read at now (ms). done: it
// applied; else a watched key changed, or err.
func (b *gcraBatch) swap(ctx context.Context, conn *redis.Conn, where Site, now int64) (done bool, err error) {
	t := txn.New(b.ks, false)
	for k, key := range b.keys {
		switch {
		case b.tats[k] == b.read[k]:
		case b.tats[k].Empty(now):
			t.Add("del", key) // only a refund empties a bucket
		default:
			t.Add(b.write(k, key, now)...)
		}
	}
	outcome, err := t.ExecOn(ctx, conn, where.Node.Options().ReadTimeout)
	switch {
	case outcome == txn.Ran:
		return true, nil
	case errors.Is(err, redis.TxFailedErr):
		return false, nil // the EXEC ran, and ended the WATCH
	}
	// The EXEC may never have been sent (the caller gave up first): the
	// WATCH would go back to the pool with the connection.
	unwatch(ctx, conn)
	return false, err
}

// write is the SET that leaves key k's TAT as the calls decided at now
// (ms): see gcraStore.
func (b *gcraBatch) write(k int, key string, now int64) []any {
	tat := b.tats[k]
	if !b.read[k].Empty(now) {
		if x := tat.Ms - 1; x != b.ttl[k] {
			return []any{"set", key, tat.Short, "pxat", x}
		}
		return []any{"set", key, tat.Short, "keepttl"}
	}
	// From w, as Redis counts PX: cost is tat less now.
	if cost := tat.Ms - now; cost > 1 {
		return []any{"set", key, tat.Short, "px", cost - 1}
	}
	return []any{"set", key, tat.Short + b.rate[k], "px", 1}
}

// readOn reads the TATs into b.read on conn, under WATCH if watch, and
// returns Redis's time.
func (b *gcraBatch) readOn(ctx context.Context, conn pipeliner, watch bool) (time.Time, error) {
	ttls, values := make([]*redis.Cmd, len(b.keys)), make([]*redis.StringCmd, len(b.keys))
	var clock *redis.TimeCmd
	cmds, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if watch {
			args := make([]any, 0, len(b.keys)+1)
			args = append(args, "watch")
			for _, k := range b.keys {
				args = append(args, k)
			}
			pipe.Do(ctx, args...)
		}
		for k, key := range b.keys {
			ttls[k], values[k] = pipe.Do(ctx, "pexpiretime", key), pipe.Get(ctx, key)
		}
		clock = pipe.Time(ctx)
		return nil
	})
	// redis.Nil: a GET of an empty bucket, which has no key; the first
	// error is err, and another may follow it.
	for _, cmd := range cmds {
		if e := cmd.Err(); e != nil && !errors.Is(e, redis.Nil) {
			err = e
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, err
	}
	for k := range b.keys {
		b.ttl[k], _ = ttls[k].Int64()
		b.read[k] = tatOf(b.ttl[k], values[k].Val(), b.rate[k])
	}
	return clock.Val(), nil
}

// tatOf is the TAT of a key whose expiry is x (ms; -2: no key, -1: none
// this code wrote, an empty bucket written over) and whose value is v,
// for a bucket of rate: see gcraStore. A value this code did not write
// ("" before it kept fractions, or any other) reads as the TAT x+1, never
// less than the bucket holds.
func tatOf(x int64, v string, rate int64) limits.TAT {
	if x < 0 {
		return limits.TAT{}
	}
	short, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil || short < 0 || short >= 2*rate:
		return limits.TAT{Ms: x + 1}
	case short >= rate:
		return limits.TAT{Ms: x} // kept a ms longer: the TAT rounded up
	}
	return limits.TAT{Ms: x + 1, Short: short}
}

// decide decides the calls, in order, at now (ms), each on the buckets
// the calls before it left; it reports whether any was admitted.
func (b *gcraBatch) decide(now int64) bool {
	copy(b.tats, b.read)
	admitted := false
	for i, c := range b.calls {
		v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
		b.count(i, v, c.N)
		// A call AtMost is judged at the room the read leaves it: the
		// TATs advance for that weight alone, in the same swap.
		n := c.Weight(b.Rules, v.Counts)
		if n != c.N {
			b.count(i, v, n)
		}
		b.views[i] = v
		if !v.Fits(b.Rules, n) {
			continue
		}
		admitted = true
		for r := range b.Rules {
			if k := b.keyOf[i][r]; !b.sharesKey(i, r) {
				b.tats[k] = b.buckets[r].Advance(b.tats[k], now, n)
			}
		}
	}
	return admitted
}

// count fills v.Counts with what call i's buckets count, at v.Now, for a
// call of weight n, as the calls decided before it left them.
func (b *gcraBatch) count(i int, v limits.View, n int) {
	for r := range b.Rules {
		v.Counts[r] = b.buckets[r].Count(b.tats[b.keyOf[i][r]], v.Now, n)
	}
}

// sharesKey reports whether rule r of call i keeps its TAT in the key of
// an earlier rule of the call, already advanced for it.
func (b *gcraBatch) sharesKey(i, r int) bool {
	for q := range r {
		if b.keyOf[i][q] == b.keyOf[i][r] {
			return true
		}
	}
	return false
}

// unwatch clears a WATCH from conn before it goes back to the pool, even
// after the caller gave up: a pooled connection still watching would abort
// another transaction's EXEC.
func unwatch(ctx context.Context, conn *redis.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
	defer cancel()
	_ = conn.Do(ctx, "unwatch").Err()
}

func (s gcraStore) Peek(ctx context.Context, where Site, client string, n int) (limits.View, error) {
	b := s.newBatch(where.Keys, []limits.Call{{Client: client, N: n}})
	now, err := b.readOn(ctx, where.conn(), false)
	if err != nil {
		return limits.View{}, err
	}
	b.decide(now.UnixMilli())
	return b.views[0], nil
}

// Flush deletes client's buckets. A per-resource bucket is one TAT, which
// keeps no client's share: it stays as it is. In the same transaction it
// starts a new generation of the resource (see newGeneration).
func (s gcraStore) Flush(ctx context.Context, where Site, client string) error {
	if !s.HasClientRule {
		return ErrNoClientBucket
	}
	var del []string
	for r, rule := range s.Rules {
		if rule.PerClient {
			del = append(del, s.key(where.Keys, r, client))
		}
	}
	_, err := where.Node.TxPipelined(ctx, func(p redis.Pipeliner) error {
		s.newGeneration(ctx, p, where.Keys)
		p.Del(ctx, del...)
		return nil
	})
	return err
}

// FlushAll deletes every bucket of the resource, once it started a new
// generation of the resource (see newGeneration).
func (s gcraStore) FlushAll(ctx context.Context, where Site) error {
	if err := s.newGeneration(ctx, where.Node, where.Keys).Err(); err != nil {
		return err
	}
	return deleteUnder(ctx, where, where.Keys.GCRA(), s.ScanCount)
}

// newGeneration names a new generation of the resource's buckets, which a
// Refund checks: a refund of a call admitted before a Flush would give
// back weight the Flush already took out, from the calls counted since.
// Once every bucket has drained since (the longest Span), every call
// admitted before has drained too, and the key may go.
func (s gcraStore) newGeneration(ctx context.Context, c redis.Cmdable, ks keys.Space) *redis.StatusCmd {
	var span int64
	for _, b := range s.buckets {
		span = max(span, b.Span())
	}
	return c.Set(ctx, ks.Generation(), strconv.FormatUint(rand.Uint64(), 36), time.Duration(span+1000)*time.Millisecond)
}
