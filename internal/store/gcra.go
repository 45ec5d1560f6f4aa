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
	s := gcraStore{Plan: p, lockFree: lockFree{clientScoped: p.ClientScoped},
		id: strconv.FormatUint(rand.Uint64(), 36)}
	for _, r := range p.Rules {
		b := limits.BucketOf(r)
		s.buckets = append(s.buckets, b)
		s.names = append(s.names, strconv.FormatInt(b.Interval, 10)+":"+strconv.Itoa(b.Burst))
	}
	return s
}

// gcraStore is the GCRA strategy: a leaky bucket per rule and scope, each
// one number, its TAT (limits.Bucket), in a string key that expires when
// the bucket is empty. A batch of a line is decided by compare-and-swap,
// without a script, in two round trips:
//
//  1. SET fence PX margin, WATCH the batch's TATs and the fence, MGET the
//     TATs, TIME and PTTL fence. The fence is this line's own key, so
//     nothing but this line writes it, and it expires margin after the SET
//     ran: no later than s = TIME + margin + 1ms (Redis keeps a key
//     through its deadline's millisecond). PTTL shows it still there after
//     the WATCH; else the round trip was late, and the batch starts again.
//  2. The calls are decided, in order, at the time TIME read, each on the
//     buckets as the calls before it left them; each admitted call
//     advances its buckets from s. Then MULTI, SET each changed TAT PXAT
//     its end, EXEC. EXEC applies only if no TAT changed since the WATCH
//     and the fence has not expired, so before s; else it applies
//     nothing, and the batch is decided again.
//
// So a call is decided on the TATs as they stand when it is written, at a
// time no later than the write (TIME ran before EXEC), and counted from a
// time no earlier than it (s): no call is counted before it ran, so the
// calls admitted are calls GCRA admits at the times Redis ran them. A
// batch whose calls are all denied writes nothing and costs one round
// trip and an UNWATCH. The calls are evaluated (Evaluate) only once their
// write has applied: a batch that fails returns its error, and no call of
// it reads as admitted.
type gcraStore struct {
	Plan
	lockFree
	buckets []limits.Bucket // by rule
	names   []string        // by rule: its bucket's part of the key, "I:B"
	id      string          // names this store's fences, one per line
}

// The fence's margin, the time it leaves the second round trip: longer,
// the margin is charged to a call that finds its bucket holding less (see
// docs/strategies.md); shorter, a slow round trip aborts the EXEC. A batch
// that saw its round trips take longer than the margin doubles it for its
// next attempt, up to maxFenceMargin.
const (
	fenceMargin    = 10 * time.Millisecond
	maxFenceMargin = time.Second
)

// casFirstWait and casLongestWait pace a batch's attempts after its EXEC
// found a TAT changed: jittered, so that the processes that lost do not
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
	line := "0"
	if s.Line(where.Keys, calls[0].Client) != where.Keys.Slot() {
		line = "1"
	}
	fence := where.Keys.Fence(s.id + line)
	pace := backoff.Jittered(casFirstWait, casLongestWait)
	margin := fenceMargin
	for {
		done, slow, err := b.attempt(ctx, where, fence, margin)
		if err != nil {
			return err
		}
		if done {
			for i := range calls {
				evaluate(i, b.views[i])
			}
			return nil
		}
		if slow {
			margin = min(2*margin, maxFenceMargin)
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
	tats  []int64  // by key: as read, then as the calls decided leave them
	dirty []bool   // by key: changed by an admitted call
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
	b.tats, b.dirty = make([]int64, len(b.keys)), make([]bool, len(b.keys))
	return b
}

// attempt makes one compare-and-swap of the batch (see gcraStore). done:
// it applied, or nothing was to write; slow: it did not, and its round
// trips took longer than margin, which may be why.
func (b *gcraBatch) attempt(ctx context.Context, where Site, fence string, margin time.Duration) (done, slow bool, err error) {
	conn := where.Node.Conn()
	defer conn.Close()
	sent := time.Now()
	now, alive, err := b.read(ctx, conn, fence, margin)
	if err != nil || !alive {
		unwatch(ctx, conn)
		return false, true, err
	}
	where.Clock.Observe(now, sent, time.Now())
	s := (now.UnixMilli() + margin.Milliseconds() + 1) * 1_000_000
	if !b.decide(now.UnixNano(), now.UnixMilli(), s) {
		unwatch(ctx, conn)
		return true, false, nil
	}
	t := txn.New(b.ks, false)
	for k, key := range b.keys {
		if b.dirty[k] {
			t.Add("set", key, b.tats[k], "pxat", (b.tats[k]+999_999)/1_000_000+1)
		}
	}
	outcome, err := t.ExecOn(ctx, conn, where.Node.Options().ReadTimeout)
	switch {
	case outcome == txn.Ran:
		return true, false, nil
	case errors.Is(err, redis.TxFailedErr):
		return false, time.Since(sent) >= margin, nil
	}
	return false, false, err
}

// read sends the first round trip on conn, and reads the TATs into
// b.tats; it returns Redis's time, and whether the fence was still there
// after the WATCH.
func (b *gcraBatch) read(ctx context.Context, conn *redis.Conn, fence string, margin time.Duration) (time.Time, bool, error) {
	watch := make([]any, 0, len(b.keys)+2)
	watch = append(watch, "watch")
	for _, k := range b.keys {
		watch = append(watch, k)
	}
	watch = append(watch, fence)
	var tats *redis.SliceCmd
	var clock *redis.TimeCmd
	var pttl *redis.Cmd
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		// SET before WATCH: a connection's own write to a key it watches
		// would abort its EXEC.
		pipe.Do(ctx, "set", fence, "1", "px", margin.Milliseconds())
		pipe.Do(ctx, watch...)
		tats = pipe.MGet(ctx, b.keys...)
		clock = pipe.Time(ctx)
		pttl = pipe.Do(ctx, "pttl", fence)
		return nil
	})
	if err != nil {
		return time.Time{}, false, err
	}
	if err := parseTATs(tats.Val(), b.keys, b.tats); err != nil {
		return time.Time{}, false, err
	}
	left, err := pttl.Int64()
	return clock.Val(), left > 0, err
}

// parseTATs reads MGET's replies into tats: 0 for a bucket with no key.
func parseTATs(replies []any, keys []string, tats []int64) error {
	for k, v := range replies {
		tats[k] = 0
		s, ok := v.(string)
		if !ok {
			continue // nil: no key, an empty bucket
		}
		tat, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("leakybucket: the TAT %q holds %q, not a time: %w", keys[k], s, err)
		}
		tats[k] = tat
	}
	return nil
}

// decide decides the calls, in order, at now (ns; nowMs in ms), each on
// the buckets the calls before it left, advancing those of an admitted
// call from s; it reports whether any was admitted.
func (b *gcraBatch) decide(now, nowMs, s int64) bool {
	clear(b.dirty)
	admitted := false
	for i, c := range b.calls {
		v := limits.View{Now: nowMs, Counts: make([]limits.Count, len(b.Rules))}
		fits := true
		for r, rule := range b.Rules {
			v.Counts[r] = b.buckets[r].Count(b.tats[b.keyOf[i][r]], now, nowMs, c.N)
			fits = fits && rule.HasRoom(v.Counts[r].Used, c.N)
		}
		b.views[i] = v
		if !fits {
			continue
		}
		admitted = true
		for r := range b.Rules {
			if k := b.keyOf[i][r]; !b.sharesKey(i, r) {
				b.tats[k] = b.buckets[r].Advance(b.tats[k], s, c.N)
				b.dirty[k] = true
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
	var tats *redis.SliceCmd
	var clock *redis.TimeCmd
	_, err := where.conn().Pipelined(ctx, func(pipe redis.Pipeliner) error {
		tats, clock = pipe.MGet(ctx, b.keys...), pipe.Time(ctx)
		return nil
	})
	if err != nil {
		return limits.View{}, err
	}
	if err := parseTATs(tats.Val(), b.keys, b.tats); err != nil {
		return limits.View{}, err
	}
	now := clock.Val()
	b.decide(now.UnixNano(), now.UnixMilli(), 0)
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
