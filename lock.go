package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/bsm/redislock"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// lock is a mutual-exclusion lock in Redis that needs no script: every
// command it sends is a string or transaction command, which an ACL with
// -@scripting still grants. (github.com/bsm/redislock runs each of its
// operations as a Lua script, so its Lock fails there with NOPERM; only its
// RetryStrategy is used here.)
//
// The protocol, on one connection (a *redis.Tx):
//
//  1. SET key token NX PXAT deadline takes the lock, until an absolute
//     deadline in the server's clock (see redisClock), so that a SET that
//     Redis runs late, after a pause, ends when it was meant to.
//  2. WATCH key, then GET key: the GET proves the watched value is our token,
//     so from here on any change to the key, including its expiry (Redis >= 7.0
//     aborts EXEC when a watched key expired), aborts step 3.
//  3. MULTI, the critical section's writes, DEL key, EXEC. The writes and the
//     release are one transaction fenced by the WATCH: a holder whose lock
//     expired (a slow SCAN, a paused process) writes nothing, and a late
//     release never deletes another holder's lock.
//
// WATCH must come after SET: a connection's own write to a key it watches
// aborts its EXEC too.
//
// Whenever a SET of ours may have taken the lock (it was sent, whatever the
// reply) and step 3 did not confirm the release, free runs in the
// background: compare-and-delete (WATCH, GET, MULTI DEL EXEC) on another
// connection, retried until the key is deleted or the lock's deadline has
// passed in Redis's own clock. So a caller that gives up, a lost reply or a
// dropped connection never leaves a lock behind for longer than Redis takes
// to answer again.
//
// An uncontended holder pays one round trip for steps 1 and 2 together with
// the caller's first reads, and one for step 3.
type lock struct {
	key   string
	token string
	ttl   time.Duration
	retry redislock.RetryStrategy
	node  *redis.Client // where free runs
	clock *redisClock   // the node's clock

	// view is what this process knows of the lock across attempts.
	view *lockView

	deadline  int64     // Redis ms at which our latest SET expires; 0 if sent with PX
	sent      time.Time // when our latest SET was sent
	lifetime  time.Duration
	maybeHeld bool // a SET of ours may hold the lock, and no release confirmed it is gone
	queued    bool // we are next in line (see queueing)
	ran       bool // the reply to our latest SET arrived: it ran
	watching  bool // a WATCH of ours is active on the connection
}

// newLock returns a lock on key of node; a nil retry strategy means
// NoRetry.
func newLock(key string, ttl time.Duration, retry redislock.RetryStrategy, node *redis.Client, clock *redisClock, view *lockView) *lock {
	if retry == nil {
		retry = redislock.NoRetry()
	}
	return &lock{key: key, token: uuid.NewString(), ttl: ttl, retry: retry, node: node, clock: clock, view: view}
}

// lockView is what the callers of one lock in this process learned of it,
// kept across attempts and batches: whether it was last seen held by
// another holder, and when another waiter was last seen next in line.
type lockView struct {
	mu        sync.Mutex
	busy      bool
	busySeen  time.Time // when the lock was last seen held by another
	claimSeen time.Time
}

func (v *lockView) setBusy(busy bool) {
	v.mu.Lock()
	v.busy = busy
	if busy {
		v.busySeen = time.Now()
	}
	v.mu.Unlock()
}

// freeSince reports whether the lock was not seen held by another since t.
func (v *lockView) freeSince(t time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.busySeen.Before(t)
}

// contended reports whether the lock was last seen held by another holder.
func (v *lockView) contended() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.busy
}

func (v *lockView) sawClaim() {
	v.mu.Lock()
	v.claimSeen = time.Now()
	v.mu.Unlock()
}

// deferring reports whether another waiter was seen next in line within
// queueTTL: then we do not even try to take the lock (see queueing).
func (v *lockView) deferring() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return time.Since(v.claimSeen) < queueTTL
}

// lockGrace is how long a lock outlives the deadline of the calls it
// decides, at most: time for the holder to finish the round trip under way.
const lockGrace = 50 * time.Millisecond

// unwatchTimeout bounds the UNWATCH that cleans a connection before it goes
// back to the pool, after an error.
const unwatchTimeout = 100 * time.Millisecond

// obtain takes the lock on tx's connection and runs the commands queued by
// read after it is taken and watched, in the same round trip when the lock is
// free. While the lock is busy it waits as the retry strategy says, until the
// context ends; then it returns ErrLockNotObtained joined with the context's
// error. A Redis or I/O error ends it at once.
func (l *lock) obtain(ctx context.Context, tx *redis.Tx, read func(redis.Pipeliner)) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for first := true; ; first = false {
		ok, err := l.try(ctx, tx, first, read)
		if err != nil || ok {
			l.report(false)
			return err
		}
		l.report(true)
		if err := l.wait(ctx, timer); err != nil {
			return err
		}
	}
}

// wait sleeps until the next attempt, as the retry strategy says (at most
// queuePoll while we are next in line), and returns ErrLockNotObtained if
// the strategy gives up or ctx ends first.
func (l *lock) wait(ctx context.Context, timer *time.Timer) error {
	backoff := l.retry.NextBackoff()
	if backoff <= 0 {
		return ErrLockNotObtained
	}
	if l.queued {
		backoff = min(backoff, queuePoll)
	}
	timer.Reset(backoff)
	select {
	case <-ctx.Done():
		timer.Stop()
		return fmt.Errorf("%w: %w", ErrLockNotObtained, context.Cause(ctx))
	case <-timer.C:
		return nil
	}
}

func (l *lock) report(busy bool) { l.view.setBusy(busy) }

// try makes one attempt. The first sends SET NX with WATCH, GET and the reads
// in one round trip. Later ones send SET NX alone, so that polling a busy
// lock costs the server little, and watch and read only once it is taken.
// Every attempt starts with UNWATCH: a failed attempt's WATCH would see the
// holder's release and abort our EXEC. Every attempt also reads who is
// next in line (see queueing), and later ones ask to be.
func (l *lock) try(ctx context.Context, tx *redis.Tx, first bool, read func(redis.Pipeliner)) (bool, error) {
	if !l.queued && l.view.deferring() {
		if waiting, err := l.othersWaiting(ctx, tx); waiting || err != nil {
			return false, err
		}
	}
	args := l.setArgs(ctx)
	claim := !first && willWait(ctx)
	l.maybeHeld, l.ran, l.sent = true, false, time.Now()
	ctx, cancel := l.holding(ctx)
	defer cancel()
	a := l.send(ctx, tx, claim, first, args, read)
	l.watching = a.watch != nil && a.watch.Err() == nil
	if err := a.set.Err(); err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	l.ran = true
	if now, err := a.clock.Result(); err == nil {
		l.clock.observe(now.UnixMilli(), l.sent, time.Now())
	}
	next := a.next.Val()
	l.queued = next == l.token
	if next != "" && !l.queued {
		l.view.sawClaim()
	}
	if errors.Is(a.set.Err(), redis.Nil) {
		l.maybeHeld = false // held by another: our SET ran and set nothing
		return false, nil
	}
	if next != "" && !l.queued {
		return false, l.yield(ctx, tx)
	}
	return l.confirm(ctx, tx, a, read)
}

// attempt holds the replies of one try's first round trip.
type attempt struct {
	set   *redis.Cmd
	clock *redis.TimeCmd
	next  *redis.StringCmd // who is next in line
	watch *redis.Cmd       // nil unless sent
	get   *redis.StringCmd
}

func (l *lock) send(ctx context.Context, tx *redis.Tx, claim, first bool, args []any, read func(redis.Pipeliner)) attempt {
	var a attempt
	_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "unwatch")
		a.set = pipe.Do(ctx, args...)
		a.clock = pipe.Time(ctx)
		if claim {
			pipe.SetNX(ctx, l.nextKey(), l.token, queueTTL)
		}
		a.next = pipe.Get(ctx, l.nextKey())
		if first {
			a.watch, a.get = l.watch(ctx, pipe, read)
		}
		return nil
	})
	return a
}

// confirm watches the lock that our SET took, if the attempt did not
// already, and checks that it is still ours.
func (l *lock) confirm(ctx context.Context, tx *redis.Tx, a attempt, read func(redis.Pipeliner)) (bool, error) {
	if a.watch == nil {
		_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			a.watch, a.get = l.watch(ctx, pipe, read)
			return nil
		})
		l.watching = a.watch.Err() == nil
	}
	if err := a.watch.Err(); err != nil {
		return false, err
	}
	token, err := a.get.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	if token != l.token {
		// Our lock expired before WATCH: not ours any more. Should it have
		// been born expired, the clock estimate was off: start it again
		// from this attempt.
		l.maybeHeld = false
		if now, err := a.clock.Result(); err == nil && l.deadline != 0 && now.UnixMilli() >= l.deadline {
			l.clock.reset()
		}
		return false, nil
	}
	return true, nil
}

// Queueing. A plain SET NX lock is unfair: a holder that releases and
// tries again at once, or a caller that just arrived, takes it before a
// waiter that sleeps between polls, so callers with a steady stream of
// calls can starve another process's waiter for as long as they keep
// coming. So a waiter that found the lock busy asks to be next in line
// (SET lock:next token NX PX 5ms, with each poll, if it has at least 5 ms
// left to wait), anyone who takes the
// lock while another is next in line gives it back at once (yield) and
// waits its turn, and a process that saw another waiter next in line in
// the last 5 ms only reads the claim (GET lock:next) until it is gone,
// rather than take the lock only to give it back. The next in line polls every millisecond at least,
// and its claim lapses 5 ms after its last poll, so a waiter that gave up
// holds nobody up for longer. The
// holder that was next in line clears the claim with its release.
// Safety does not depend on any of this: it is the SET NX and the WATCH.
const (
	queueTTL  = 5 * time.Millisecond
	queuePoll = time.Millisecond
)

func (l *lock) nextKey() string { return l.key + ":next" }

// willWait reports whether the callers of ctx can wait their turn: a claim
// to be next in line asks everyone else to stand back for up to queueTTL,
// so only a waiter with at least that long left makes one.
func willWait(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return !ok || time.Until(d) >= queueTTL
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
	if err := l.release(ctx, tx, func(redis.Pipeliner) {}); err != nil && !errors.Is(err, ErrLockExpired) {
		return err
	}
	return nil
}

// holding returns the context of the round trips made while the lock may
// be ours: detached from the callers' (ctx keeps only its values), so that
// a caller giving up never cuts one in the middle, which would leave the
// lock to be freed in the background; and ending holdGrace after the lock,
// so that a decision that outlived its lock hears from Redis that its
// write was refused (ErrLockExpired) rather than timing out.
func (l *lock) holding(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), l.sent.Add(l.lifetime+holdGrace))
}

// holdGrace is how long after the lock's deadline its holder's round trips
// and the background release go on.
const holdGrace = time.Second

// setArgs is SET key token NX with the lock's deadline: the lock TTL, or
// less when ctx ends sooner (plus lockGrace), as an absolute PXAT in the
// server's clock once it is known, else as a relative PX.
func (l *lock) setArgs(ctx context.Context) []any {
	l.lifetime = l.ttl
	if d, ok := ctx.Deadline(); ok {
		l.lifetime = max(min(l.ttl, time.Until(d)+lockGrace), time.Millisecond)
	}
	now, ok := l.clock.now()
	if !ok {
		l.deadline = 0
		return []any{"set", l.key, l.token, "nx", "px", l.lifetime.Milliseconds()}
	}
	l.deadline = now + l.lifetime.Milliseconds()
	return []any{"set", l.key, l.token, "nx", "pxat", strconv.FormatInt(l.deadline, 10)}
}

func (l *lock) watch(ctx context.Context, pipe redis.Pipeliner, read func(redis.Pipeliner)) (*redis.Cmd, *redis.StringCmd) {
	watch := pipe.Do(ctx, "watch", l.key)
	get := pipe.Get(ctx, l.key)
	read(pipe)
	return watch, get
}

// release applies the writes queued by write and frees the lock in one
// MULTI/EXEC. If the lock expired or changed hands since it was watched, EXEC
// applies nothing and release returns ErrLockExpired.
func (l *lock) release(ctx context.Context, tx *redis.Tx, write func(redis.Pipeliner)) error {
	_, err := tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		write(pipe)
		pipe.Del(ctx, l.key)
		if l.queued {
			pipe.Del(ctx, l.nextKey())
		}
		return nil
	})
	switch {
	case err == nil:
		l.maybeHeld, l.watching = false, false
	case errors.Is(err, redis.TxFailedErr):
		// The watched key changed after our token was read: the lock is not
		// ours any more.
		l.maybeHeld, l.watching = false, false
		err = ErrLockExpired
	case redis.IsExecAbortError(err):
		// EXEC ran and dropped the WATCH, but applied nothing: the lock is
		// still ours, and free must delete it.
		l.watching = false
	}
	return err
}

// cleanup runs after every decision. On success it has nothing to do.
// After an error it clears our WATCH from the connection, so that it goes
// back to the pool clean, and, if a SET of ours may hold the lock, starts
// free in the background: the caller returns at once.
func (l *lock) cleanup(ctx context.Context, tx *redis.Tx) {
	if l.watching {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unwatchTimeout)
		_ = tx.Unwatch(ctx).Err()
		cancel()
		l.watching = false
	}
	if l.maybeHeld {
		l.maybeHeld = false
		go l.free()
	}
}

// Backoff of free's attempts while the key is not (or not yet) ours.
const (
	freeFirstBackoff = 2 * time.Millisecond
	freeMaxBackoff   = 50 * time.Millisecond
)

// free deletes the lock if it is ours, by compare-and-delete, on a
// connection of its own, detached from any caller's context. It stops once
// it deleted our token, or once the lock cannot be ours any more: our SET
// ran (its reply came back) and the key holds something else, or its
// deadline passed in the server's clock. Until then it retries, backing off
// up to freeMaxBackoff: a SET whose reply was lost may still be queued in
// Redis (a paused server runs it when it resumes), and the lock it takes
// must not outlive its caller by more than about one backoff.
//
// It gives up once the server refuses connections (it is down, and its
// queued commands with it), or at the host's estimate of the lock's
// deadline plus a grace period;
// with a relative PX (no clock sample yet), a SET that Redis runs after
// that can block others for up to the lock's lifetime.
func (l *lock) free() {
	ctx, cancel := context.WithDeadline(context.Background(), l.sent.Add(l.lifetime+holdGrace))
	defer cancel()
	backoff := freeFirstBackoff
	for {
		done := l.compareAndDelete(ctx)
		if done || ctx.Err() != nil {
			return
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, freeMaxBackoff)
	}
}

// compareAndDelete makes one attempt of free, and reports whether it is
// over: WATCH, GET and TIME in one round trip, then MULTI, DEL, EXEC if
// the key is ours (EXEC also ends the WATCH), else UNWATCH.
func (l *lock) compareAndDelete(ctx context.Context) bool {
	over := false
	err := l.node.Watch(ctx, func(tx *redis.Tx) error {
		var watch *redis.Cmd
		var get *redis.StringCmd
		var clock *redis.TimeCmd
		_, err := tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			watch = pipe.Do(ctx, "watch", l.key)
			get = pipe.Get(ctx, l.key)
			clock = pipe.Time(ctx)
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			if watch.Err() == nil {
				_ = tx.Unwatch(ctx).Err()
			}
			return err
		}
		if get.Val() != l.token {
			over = l.ran || (l.deadline != 0 && clock.Val().UnixMilli() >= l.deadline)
			return tx.Unwatch(ctx).Err()
		}
		_, err = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Del(ctx, l.key)
			return nil
		})
		over = err == nil
		return err
	})
	// A refused connection means no server runs there: whatever it held,
	// queued SETs included, is gone with it. Other errors are retried.
	// A closed client can send nothing more.
	return over || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, redis.ErrClosed)
}
