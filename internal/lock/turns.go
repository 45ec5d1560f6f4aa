package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/txn"
)

// View is what the callers of one lock in this process learned of it,
// kept across attempts and batches: whether it was last seen held by
// another holder, and when another waiter was last seen next in line.
type View struct {
	mu        sync.Mutex
	busy      bool
	busySeen  time.Time // when the lock was last seen held by another
	claimSeen time.Time
}

func (v *View) setBusy(busy bool) {
	v.mu.Lock()
	v.busy = busy
	if busy {
		v.busySeen = time.Now()
	}
	v.mu.Unlock()
}

// FreeSince reports whether the lock was not seen held by another since t.
func (v *View) FreeSince(t time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.busySeen.Before(t)
}

// Contended reports whether the lock was last seen held by another holder.
func (v *View) Contended() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.busy
}

func (v *View) sawClaim() {
	v.mu.Lock()
	v.claimSeen = time.Now()
	v.mu.Unlock()
}

// deferring reports whether another waiter was seen next in line within
// ClaimTTL: then we do not even try to take the lock, so that the
// waiter that claimed its turn gets it.
func (v *View) deferring() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return time.Since(v.claimSeen) < ClaimTTL
}

// Taking turns. A plain SET NX lock is unfair: a holder that releases and
// tries again at once, or a caller that just arrived, takes it before a
// waiter that sleeps between polls, so callers with a steady stream of
// calls can starve another process's waiter for as long as they keep
// coming. So:
//
//   - a waiter that found the lock busy, and has at least ClaimTTL left to
//     wait, claims the next turn (SET lock:next token NX PX 5ms, with each
//     poll), and polls every millisecond at least while it has it;
//   - anyone who takes the lock while another waiter has the turn gives it
//     back at once (yield) and waits;
//   - a process that saw another waiter's turn in the last ClaimTTL only
//     reads the claim (GET lock:next) until it is gone, rather than take
//     the lock only to give it back;
//   - the holder whose turn it was clears the claim with its release, and a
//     claim lapses ClaimTTL after its last poll, so a waiter that gave up
//     holds nobody up for longer.
//
// Safety does not depend on any of this: it rests on SET NX and the WATCH.
const (
	ClaimTTL  = 5 * time.Millisecond
	queuePoll = time.Millisecond
)

func (l *lock) nextKey() string { return l.key + ":next" }

// willWait reports whether the callers of ctx can wait their turn: a claim
// to be next in line asks everyone else to stand back for up to ClaimTTL,
// so only a waiter with at least that long left makes one.
func willWait(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return !ok || time.Until(d) >= ClaimTTL
}

// deferToOthers reports whether to stand back this attempt: when another
// waiter had the turn lately (and still has it), rather than take the lock
// only to give it back.
func (l *lock) deferToOthers(ctx context.Context, tx *redis.Tx) (bool, error) {
	if l.queued || !l.view.deferring() {
		return false, nil
	}
	return l.othersWaiting(ctx, tx)
}

// othersWaiting reads whether another waiter is next in line, without
// trying to take the lock: how a caller that recently saw one defers to it.
func (l *lock) othersWaiting(ctx context.Context, tx *redis.Tx) (bool, error) {
	next, err := tx.Get(ctx, l.nextKey()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	if next != "" && next != l.token {
		l.view.sawClaim()
		return true, nil
	}
	return false, nil
}

// yield gives back the lock that our SET just took, to the waiter next in
// line: compare-and-delete on our connection.
func (l *lock) yield(ctx context.Context, tx *redis.Tx) error {
	if !l.watching {
		var get *redis.StringCmd
		_, err := tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Do(ctx, "watch", l.key)
			get = pipe.Get(ctx, l.key)
			return nil
		})
		l.watching = err == nil || errors.Is(err, redis.Nil)
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if get.Val() != l.token {
			l.maybeHeld = false
			return nil // it expired meanwhile: nothing to give back
		}
	}
	if err := l.release(ctx, tx, func(*txn.Txn) {}, txn.Acks{}); err != nil && !errors.Is(err, ErrExpired) {
		return err
	}
	return nil
}
