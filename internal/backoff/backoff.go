// Package backoff paces retries: waits that double from a first one up to
// a longest, optionally drawn within ±25 % so that the waiters of many
// processes do not poll in step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff hands out the waits between attempts. It implements
// redislock.RetryStrategy and lock.Retry. It is not safe for concurrent use: each retry
// loop has its own.
type Backoff struct {
	next, max time.Duration
	jittered  bool
}

// New returns waits of first, 2*first, 4*first... up to max.
func New(first, max time.Duration) *Backoff { return &Backoff{next: first, max: max} }

// Jittered is New, each wait drawn within ±25 % of it.
func Jittered(first, max time.Duration) *Backoff {
	return &Backoff{next: first, max: max, jittered: true}
}

// NextBackoff returns the next wait.
func (b *Backoff) NextBackoff() time.Duration {
	d := b.next
	b.next = min(2*b.next, b.max)
	if b.jittered {
		return d - d/4 + rand.N(d/2+1)
	}
	return d
}

// Retry calls attempt until it reports that it is over or ctx ends,
// waiting as b says between attempts. An attempt is never started after
// ctx ended.
func (b *Backoff) Retry(ctx context.Context, attempt func() (over bool)) {
	for !attempt() && Sleep(ctx, b.NextBackoff()) == nil {
	}
}

// Sleep waits for d, or until ctx ends: then it returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
