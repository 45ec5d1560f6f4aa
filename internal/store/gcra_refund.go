package store

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// A Refunder is a store that can give back the weight of a call it
// admitted (the root package's Refund): GCRA's, so far.
type Refunder interface {
	// Refund gives back up to n units of a call of weight admitted by
	// client, decided at at (ms, Redis time, no later than it started to
	// count), of which given (by rule, limits.Bucket.Giveback's cost) was
	// given back before: under each rule, as much as the call may still
	// hold there. It returns the cost given back by rule, and that in
	// weight (limits.Givebacks); nothing with an error. gen is the
	// resource's generation (Generation) read before the call was
	// decided: a Flush since took the call's weight out already, and
	// nothing is given back.
	Refund(ctx context.Context, where Site, client string, at int64, admitted, n int, given []int64, gen string) ([]int64, int, error)
	// Generation reads the resource's generation, which every Flush and
	// FlushAll changes.
	Generation(ctx context.Context, where Site) (string, error)
}

var _ Refunder = gcraStore{}

// Refund is a compare-and-swap as a decision's (see gcraStore): WATCH the
// resource's generation and the call's keys, read them and TIME (now); a
// generation other than gen gives nothing back (a Flush since took the
// call out; watched, a Flush under way aborts the EXEC); the weight given back is
// the least of n and what each bucket can still hold of the call
// (limits.Bucket.Giveback), whose cost moves each TAT back (never before
// now: limits.Bucket.Retreat); then MULTI, the SETs (or a DEL of a bucket
// left empty), EXEC, made again if a watched key changed. A TAT only
// ever moves back by weight the call still holds, so the bucket never
// holds less than the calls it admitted since, and no later decision
// admits past the rule.
func (s gcraStore) Refund(ctx context.Context, where Site, client string, at int64, admitted, n int, given []int64, gen string) ([]int64, int, error) {
	b := s.newBatch(where.Keys, []limits.Call{{Client: client, N: n}})
	pace := backoff.Jittered(casFirstWait, casLongestWait)
	for {
		back, weight, done, err := b.refundAttempt(ctx, where, at, admitted, n, given, gen)
		switch {
		case err != nil:
			return nil, 0, err
		case done:
			return back, weight, nil
		}
		if err := backoff.Sleep(ctx, pace.NextBackoff()); err != nil {
			return nil, 0, err
		}
	}
}

// refundAttempt makes one compare-and-swap of a refund; done: it applied,
// or nothing was left to give back.
func (b *gcraBatch) refundAttempt(ctx context.Context, where Site, at int64, admitted, n int, given []int64, gen string) (back []int64, weight int, done bool, err error) {
	conn := where.Node.Conn()
	defer conn.Close()
	current, err := watchGeneration(ctx, conn, where.Keys)
	if err != nil || current != gen {
		unwatch(ctx, conn)
		return nil, 0, err == nil, err
	}
	clock, err := b.readOn(ctx, conn, true)
	if err != nil {
		unwatch(ctx, conn)
		return nil, 0, false, err
	}
	now := clock.UnixMilli()
	if back, weight = limits.Givebacks(b.buckets, admitted, n, given, now-at); weight == 0 {
		unwatch(ctx, conn)
		return back, 0, true, nil
	}
	copy(b.tats, b.read)
	for r := range b.Rules {
		if k := b.keyOf[0][r]; !b.sharesKey(0, r) {
			b.tats[k] = b.buckets[r].Retreat(b.tats[k], now, back[r])
		}
	}
	done, err = b.swap(ctx, conn, where, now)
	return back, weight, done, err
}

// Generation reads the resource's generation ("" before any Flush, or
// once every call counted before the last one drained).
func (gcraStore) Generation(ctx context.Context, where Site) (string, error) {
	gen, err := where.Node.Get(ctx, where.Keys.Generation()).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return gen, err
}

// watchGeneration WATCHes the resource's generation on conn and reads it.
func watchGeneration(ctx context.Context, conn *redis.Conn, ks keys.Space) (string, error) {
	var get *redis.StringCmd
	_, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "watch", ks.Generation())
		get = p.Get(ctx, ks.Generation())
		return nil
	})
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return get.Val(), err
}
