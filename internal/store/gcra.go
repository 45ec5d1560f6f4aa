package store

import (
	"context"
	"errors"
	"fmt"
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
		// costs Redis (104 B with a name of up to 44 characters, 120 B
		// beyond, on Redis 7.0).
		s.names = append(s.names, strconv.FormatInt(b.Window, 36)+"."+strconv.FormatInt(b.Rate, 36)+"."+strconv.FormatInt(int64(b.Burst), 36))
	}
	return s
}

// gcraStore is the GCRA strategy: a leaky bucket per rule and scope, each
// one number, its TAT (limits.Bucket), kept as the expiry of a key with an
// empty value, which Redis drops once the bucket is empty. A batch of a
// line is decided by compare-and-swap, without a script, in two round
// trips on one connection:
//
//  1. WATCH the batch's keys, PEXPIRETIME of each (its TAT, or -2 where
//     the bucket is empty), TIME.
//  2. The calls are decided, in order, at the time TIME read (now), each
//     on the buckets as the calls before it left them. For each bucket an
//     admitted call changed, by cost, MULTI, SET key "" PX cost, and if
//     it held a TAT, PEXPIREAT key TAT+cost GT; EXEC. Redis sets the
//     expiry from its own clock when EXEC runs (at w): the TAT becomes
//     max(TAT, w) + cost, which is GCRA's at w, however late the EXEC
//     runs. EXEC applies nothing if a watched key changed or expired
//     since the WATCH; then the batch is decided again.
//
// So every admitted call is counted in its buckets at the time Redis
// ran its write, exactly as GCRA counts a call then; and it was decided
// on what those buckets held at now, no later than w, when they held as
// much or more: the calls admitted are calls GCRA admits at the times
// Redis ran them (it may deny one that GCRA at w would admit, by up to
// the drain between now and w). A batch whose calls are all denied
// writes nothing and costs one round trip and an UNWATCH. The calls are
// evaluated (Evaluate) only once their write has applied: a batch that
// fails returns its error, and no call of it reads as admitted.
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
	keys  []string // the distinct keys of the calls' buckets
	keyOf [][]int  // by call, by rule: its bucket's key, in keys
	read  []int64  // by key: the TAT read, 0 if none
	tats  []int64  // by key: as the calls decided leave it at now
	cost  []int64  // by key: what the admitted calls add to it, ms
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
				b.keys = append(b.keys, k)
			}
			b.keyOf[i][r] = at
		}
	}
	b.read, b.tats, b.cost = make([]int64, len(b.keys)), make([]int64, len(b.keys)), make([]int64, len(b.keys))
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
	t := txn.New(b.ks, false)
	for k, key := range b.keys {
		if b.cost[k] == 0 {
			continue
		}
		t.Add("set", key, "", "px", b.cost[k])
		// A bucket empty at the time read is empty at the EXEC's, later:
		// there max(TAT, w) is w, which PX alone counts from.
		if b.read[k] > ms {
			t.Add("pexpireat", key, b.read[k]+b.cost[k], "gt")
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

// readOn reads the TATs into b.read on conn, under WATCH if watch, and
// returns Redis's time.
func (b *gcraBatch) readOn(ctx context.Context, conn pipeliner, watch bool) (time.Time, error) {
	tats := make([]*redis.Cmd, len(b.keys))
	var clock *redis.TimeCmd
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if watch {
			args := make([]any, 0, len(b.keys)+1)
			args = append(args, "watch")
			for _, k := range b.keys {
				args = append(args, k)
			}
			pipe.Do(ctx, args...)
		}
		for k, key := range b.keys {
			tats[k] = pipe.Do(ctx, "pexpiretime", key)
		}
		clock = pipe.Time(ctx)
		return nil
	})
	if err != nil {
		return time.Time{}, err
	}
	for k, tat := range tats {
		// -2: no key, an empty bucket; -1, a key without an expiry, is
		// none this code wrote: read as empty, it is written over.
		at, err := tat.Int64()
		if err != nil {
			return time.Time{}, err
		}
		b.read[k] = max(at, 0)
	}
	return clock.Val(), nil
}

// decide decides the calls, in order, at now (ms), each on the buckets
// the calls before it left; it reports whether any was admitted.
func (b *gcraBatch) decide(now int64) bool {
	copy(b.tats, b.read)
	clear(b.cost)
	admitted := false
	for i, c := range b.calls {
		v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
		fits := true
		for r, rule := range b.Rules {
			v.Counts[r] = b.buckets[r].Count(b.tats[b.keyOf[i][r]], now, c.N)
			fits = fits && rule.HasRoom(v.Counts[r].Used, c.N)
		}
		b.views[i] = v
		if !fits {
			continue
		}
		admitted = true
		for r := range b.Rules {
			if k := b.keyOf[i][r]; !b.sharesKey(i, r) {
				b.tats[k] = b.buckets[r].Advance(b.tats[k], now, c.N)
				b.cost[k] += b.buckets[r].Cost(c.N)
			}
		}
	}
	return admitted
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
// keeps no client's share: it stays as it is.
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
	return where.Node.Del(ctx, del...).Err()
}

// FlushAll deletes every bucket of the resource.
func (s gcraStore) FlushAll(ctx context.Context, where Site) error {
	return deleteUnder(ctx, where, where.Keys.GCRA(), s.ScanCount)
}
