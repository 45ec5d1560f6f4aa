package store

import (
	"context"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// A Refunder is a store that can give back the weight of a call it
// admitted (the root package's Refund): GCRA's, so far.
type Refunder interface {
	// Refund gives back up to n of the held units of weight still counted
	// of a call by client, decided at at (ms, Redis time, no later than
	// it started to count), and returns how much it gave back: the same
	// weight under every rule, no more than the call can still hold in
	// any of them.
	Refund(ctx context.Context, where Site, client string, at int64, held, n int) (int, error)
}

var _ Refunder = gcraStore{}

// Refund is a compare-and-swap as a decision's (see gcraStore): WATCH the
// call's keys, read their TATs and TIME (now); the weight given back is
// the least of n and what each bucket can still hold of the call
// (limits.Bucket.Undrained), whose cost moves each TAT back (never before
// now: limits.Bucket.Retreat); then MULTI, the SETs (or a DEL of a bucket
// left empty), EXEC, made again if a watched key changed. A TAT only
// ever moves back by weight the call still holds, so the bucket never
// holds less than the calls it admitted since, and no later decision
// admits past the rule.
func (s gcraStore) Refund(ctx context.Context, where Site, client string, at int64, held, n int) (int, error) {
	b := s.newBatch(where.Keys, []limits.Call{{Client: client, N: held}})
	pace := backoff.Jittered(casFirstWait, casLongestWait)
	for {
		back, done, err := b.refundAttempt(ctx, where, at, held, n)
		if err != nil || done {
			return back, err
		}
		if err := backoff.Sleep(ctx, pace.NextBackoff()); err != nil {
			return 0, err
		}
	}
}

// refundAttempt makes one compare-and-swap of a refund; done: it applied,
// or nothing was left to give back.
func (b *gcraBatch) refundAttempt(ctx context.Context, where Site, at int64, held, n int) (back int, done bool, err error) {
	conn := where.Node.Conn()
	defer conn.Close()
	clock, err := b.readOn(ctx, conn, true)
	if err != nil {
		unwatch(ctx, conn)
		return 0, false, err
	}
	now := clock.UnixMilli()
	back = min(n, held)
	for r := range b.Rules {
		back = min(back, b.buckets[r].Undrained(held, now-at))
	}
	if back <= 0 {
		unwatch(ctx, conn)
		return 0, true, nil
	}
	copy(b.tats, b.read)
	for r := range b.Rules {
		if k := b.keyOf[0][r]; !b.sharesKey(0, r) {
			b.tats[k] = b.buckets[r].Retreat(b.tats[k], now, back)
		}
	}
	done, err = b.swap(ctx, conn, where, now)
	if !done {
		back = 0
	}
	return back, done, err
}
