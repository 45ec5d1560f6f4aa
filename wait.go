package leakybucket

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leakybucket/leakybucket/internal/backoff"
)

// Bounds of the jitter that Wait adds to each sleep: a tenth of the wait,
// at least minJitter and at most maxJitter.
const (
	minJitter = time.Millisecond
	maxJitter = 50 * time.Millisecond
)

// fallbackRetry is how often WaitN asks again for a weight that the
// fallback can never admit, until Redis is back (see WithFallback).
const fallbackRetry = 100 * time.Millisecond

// Wait is shorthand for WaitN(ctx, resource, client, 1).
func (b *Bucket) Wait(ctx context.Context, resource, client string) error {
	return b.WaitN(ctx, resource, client, 1)
}

// WaitN blocks until a request of weight n by client to resource is
// admitted, as AllowN admits and records it, or until ctx ends. It is a
// loop of AllowN and sleeps of the denial's RetryAfter, so every rule holds
// however many callers wait: the limit is enforced by AllowN, and waiters
// on one key are admitted as the window frees room for them, never more
// than the rules allow. Each sleep is RetryAfter plus a random jitter of up
// to a tenth of it (at least 1 ms, at most 50 ms, and never past ctx's
// deadline), so that waiters denied together do not all call Redis at the
// same moment.
//
// When ctx has a deadline and a denial's RetryAfter would outlast it, WaitN
// returns at once, without sleeping, an error that says "would exceed
// context deadline" and matches errors.Is(err, context.DeadlineExceeded),
// as x/time/rate's WaitN refuses up front. When ctx ends while WaitN
// sleeps, it returns an error matching ctx's error (context.Canceled or
// context.DeadlineExceeded).
//
// Bad input (ErrEmptyResource, ErrEmptyClient, ErrInvalidWeight) is
// returned at once, and so is any error of AllowN (ErrUnavailable,
// ErrLockNotObtained...), as AllowN returned it: WaitN waits out denials,
// not failures. A weight above a rule's Requests, which AllowN denies with
// RetryAfter Never, is refused at once with ErrInvalidWeight, sending
// nothing, as x/time/rate's WaitN fails for n above its burst: no wait
// would ever admit it. With WithRecordDenied every attempt counts as a call, so
// the retries of many waiters on one key use up its room; Wait suits
// Buckets without it. While a fallback decides (WithFallback), WaitN
// sleeps as its denials say, and asks again every 100 ms for a weight
// above a rule's share, which only Redis can admit.
func (b *Bucket) WaitN(ctx context.Context, resource, client string, n int) error {
	if err := b.check(resource, client, n); err != nil {
		return err
	}
	if err := b.fits(n); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("leakybucket: Wait(n=%d): %w", n, err)
		}
		res, err := b.AllowN(ctx, resource, client, n)
		if err != nil || res.Allowed {
			return err
		}
		sleep, err := pause(ctx, res, n)
		if err != nil {
			return err
		}
		if err := backoff.Sleep(ctx, sleep); err != nil {
			return fmt.Errorf("leakybucket: Wait(n=%d): %w", n, err)
		}
	}
}

// pause returns how long WaitN sleeps after res, a denial of weight n,
// its jitter included; or the error it returns at once, without
// sleeping, when the wait would outlast ctx's deadline.
func pause(ctx context.Context, res Result, n int) (time.Duration, error) {
	// A denial always says when to come back; a zero would spin.
	wait := max(res.RetryAfter, time.Millisecond)
	left, hasDeadline := timeLeft(ctx)
	switch {
	case res.RetryAfter == Never:
		// The fallback's share of a rule is below n (fits saw that the
		// rule is not): only Redis, once back, can admit it, at a time
		// no one knows.
		wait = fallbackRetry
	case hasDeadline && wait > left:
		return 0, &deadlineError{n: n, wait: wait, left: left}
	}
	return wait + jitter(wait, left, hasDeadline), nil
}

// timeLeft returns the time until ctx's deadline, and whether it has one.
func timeLeft(ctx context.Context) (time.Duration, bool) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	return time.Until(deadline), true
}

// jitter returns a random extra sleep after a wait: up to a tenth of it,
// clamped to [minJitter, maxJitter], and within half the time that the
// deadline leaves after the wait, so that the retry still has time to run.
func jitter(wait, left time.Duration, hasDeadline bool) time.Duration {
	most := min(max(wait/10, minJitter), maxJitter)
	if hasDeadline {
		most = min(most, (left-wait)/2)
	}
	if most <= 0 {
		return 0
	}
	return rand.N(most + 1)
}

// deadlineError is WaitN's answer when the wait a denial asks for would
// outlast the context's deadline. It matches context.DeadlineExceeded.
type deadlineError struct {
	n          int
	wait, left time.Duration
}

func (e *deadlineError) Error() string {
	return fmt.Sprintf("leakybucket: Wait(n=%d) would exceed context deadline: retry after %v, deadline in %v",
		e.n, e.wait, e.left.Round(time.Millisecond))
}

func (e *deadlineError) Unwrap() error { return context.DeadlineExceeded }
