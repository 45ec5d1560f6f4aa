// Package lock is a mutual-exclusion lock in Redis that needs no script,
// for a read-then-write that a single MULTI/EXEC cannot express (the Logs
// strategy's SCAN-then-SET). Run takes the lock, runs a Section's reads
// and writes under it, and releases it with the writes, in one
// transaction fenced by WATCH. It knows nothing of what the section reads
// or writes.
package lock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// lock is a mutual-exclusion lock in Redis that needs no script: every
// command it sends is a string or transaction command, which an ACL with
// -@scripting still grants. (github.com/bsm/redislock runs each of its
// operations as a Lua script, so its Lock fails there with NOPERM.)
//
// The protocol, on one connection (a *redis.Tx):
//
//  1. SET key token NX PXAT deadline takes the lock, until an absolute
//     deadline in the server's clock (see clock.Clock), so that a SET that
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
// Waiters take turns (see ClaimTTL), so that no process's callers starve
// another's.
//
// An uncontended holder pays one round trip for steps 1 and 2 together with
// the caller's first reads, and one for step 3.
type lock struct {
	key   string
	token string
	ttl   time.Duration
	retry Retry
	node  *redis.Client // where free runs
	clock *clock.Clock  // the node's clock

	// view is what this process knows of the lock across attempts.
	view *View

	deadline  int64     // Redis ms at which our latest SET expires; 0 if sent with PX
	sent      time.Time // when our latest SET was sent
	lifetime  time.Duration
	maybeHeld bool // a SET of ours may hold the lock, and no release confirmed it is gone
	queued    bool // we are next in line (see View.deferring)
	ran       bool // the reply to our latest SET arrived: it ran
	watching  bool // a WATCH of ours is active on the connection
}

// newLock returns a lock on key of node; a nil retry strategy means
// NoRetry.
func newLock(key string, ttl time.Duration, retry Retry, node *redis.Client, clock *clock.Clock, view *View) *lock {
	if retry == nil {
		retry = noRetry{}
	}
	return &lock{key: key, token: uuid.NewString(), ttl: ttl, retry: retry, node: node, clock: clock, view: view}
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
// context ends; then it returns ErrNotObtained joined with the context's
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
// queuePoll while we are next in line), and returns ErrNotObtained if
// the strategy gives up or ctx ends first.
func (l *lock) wait(ctx context.Context, timer *time.Timer) error {
	backoff := l.retry.NextBackoff()
	if backoff <= 0 {
		return ErrNotObtained
	}
	if l.queued {
		backoff = min(backoff, queuePoll)
	}
	timer.Reset(backoff)
	select {
	case <-ctx.Done():
		timer.Stop()
		return fmt.Errorf("%w: %w", ErrNotObtained, context.Cause(ctx))
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
// next in line (see View.deferring), and later ones ask to be.
func (l *lock) try(ctx context.Context, tx *redis.Tx, first bool, read func(redis.Pipeliner)) (bool, error) {
	if waiting, err := l.deferToOthers(ctx, tx); waiting || err != nil {
		return false, err
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
	othersTurn := l.heard(a)
	switch {
	case errors.Is(a.set.Err(), redis.Nil):
		l.maybeHeld = false // held by another: our SET ran and set nothing
		return false, nil
	case othersTurn:
		return false, l.yield(ctx, tx)
	}
	return l.confirm(ctx, tx, a, read)
}

// heard notes what the replies of an attempt whose SET ran say beside the
// SET's own answer: the server's time, and whose turn it is; it reports
// whether another waiter has the turn.
func (l *lock) heard(a attempt) bool {
	l.ran = true
	if now, err := a.clock.Result(); err == nil {
		l.clock.Observe(now, l.sent, time.Now())
	}
	next := a.next.Val()
	l.queued = next == l.token
	othersTurn := next != "" && !l.queued
	if othersTurn {
		l.view.sawClaim()
	}
	return othersTurn
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
			pipe.SetNX(ctx, l.nextKey(), l.token, ClaimTTL)
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
			l.clock.Reset()
		}
		return false, nil
	}
	return true, nil
}

// holding returns the context of the round trips made while the lock may
// be ours: detached from the callers' (ctx keeps only its values), so that
// a caller giving up never cuts one in the middle, which would leave the
// lock to be freed in the background; and ending holdGrace after the lock,
// so that a decision that outlived its lock hears from Redis that its
// write was refused (ErrExpired) rather than timing out.
func (l *lock) holding(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(ctx), l.sent.Add(l.lifetime+holdGrace))
}

// setArgs is SET key token NX with the lock's deadline: the lock TTL, or
// less when ctx ends sooner (plus lockGrace), as an absolute PXAT in the
// server's clock once it is known, else as a relative PX.
func (l *lock) setArgs(ctx context.Context) []any {
	l.lifetime = l.ttl
	if d, ok := ctx.Deadline(); ok {
		l.lifetime = max(min(l.ttl, time.Until(d)+lockGrace), time.Millisecond)
	}
	now, ok := l.clock.Now()
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
// MULTI/EXEC (package txn), followed by WAIT in the same round trip if
// acks asks for it. If the lock expired or changed hands since it was
// watched, EXEC applies nothing and release returns ErrExpired. If the
// writes ran but too few replicas acknowledged them, the lock is free and
// the error matches txn.ErrNotReplicated: the section must undo them.
func (l *lock) release(ctx context.Context, tx *redis.Tx, write func(*txn.Txn), acks txn.Acks) error {
	t := &txn.Txn{Acks: acks}
	write(t)
	t.Add("del", l.key)
	if l.queued {
		t.Add("del", l.nextKey())
	}
	o, err := t.ExecOn(ctx, tx, l.node.Options().ReadTimeout)
	switch {
	case o == txn.Ran, o == txn.Unreplicated:
		l.maybeHeld, l.watching = false, false
	case errors.Is(err, redis.TxFailedErr):
		// The watched key changed after our token was read: the lock is not
		// ours any more.
		l.maybeHeld, l.watching = false, false
		err = ErrExpired
	case o == txn.NotRun:
		// EXEC ran and dropped the WATCH, but applied nothing (EXECABORT):
		// the lock is still ours, and free must delete it.
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

// Retry says how long to wait before the next attempt to take a busy lock;
// a wait of 0 or less gives up. *backoff.Backoff is one.
type Retry interface{ NextBackoff() time.Duration }

type noRetry struct{}

func (noRetry) NextBackoff() time.Duration { return 0 }

// A Section is the work done under the lock.
type Section interface {
	// Read queues the first reads, sent with the SET that takes the lock
	// when it is free.
	Read(ctx context.Context, pipe redis.Pipeliner)
	// Finish reads their replies, and whatever else is needed, on tx's
	// connection, under the lock.
	Finish(ctx context.Context, tx *redis.Tx) error
	// Write queues the writes, applied with the release or not at all.
	Write(t *txn.Txn)
}

// Options are how a lock is taken.
type Options struct {
	TTL   time.Duration // the longest a holder keeps it
	Retry Retry         // waits while it is held by another; nil: no retry
	Clock *clock.Clock  // node's, for absolute deadlines (SET ... PXAT)
	// Holders, if not nil, give the turns to take locks on node's server
	// (see Holders).
	Holders *Holders
	// Acks: the replicas that must acknowledge the section's writes
	// before Run returns nil (see txn.Acks); none if zero.
	Acks txn.Acks
}

// Run runs s under the lock key of node, on one connection: take the lock
// and queue s's reads (one round trip, more if s needs more), then queue
// s's writes and release the lock in one MULTI/EXEC (one more). view
// keeps what this process learned of the lock. ctx bounds the wait for the
// lock; once a SET is sent, the round trips are bounded by the lock's
// deadline instead, so a caller that gives up never cuts a holder in the
// middle. It first waits for a turn of o.Holders, as long as ctx lets it.
// A busy lock makes it return ErrNotObtained (joined with ctx's error if
// ctx ended); a lock lost before the release, ErrExpired; writes that
// ran with the release but that too few replicas acknowledged (o.Acks),
// an error matching txn.ErrNotReplicated.
func Run(ctx context.Context, node *redis.Client, key string, o Options, view *View, s Section) error {
	give, err := o.Holders.take(ctx, node)
	if err != nil {
		return err
	}
	defer give()
	return node.Watch(ctx, func(tx *redis.Tx) error {
		l := newLock(key, o.TTL, o.Retry, node, o.Clock, view)
		defer l.cleanup(ctx, tx)
		if err := l.obtain(ctx, tx, func(pipe redis.Pipeliner) { s.Read(ctx, pipe) }); err != nil {
			return l.outlived(err)
		}
		hold, cancel := l.holding(ctx)
		defer cancel()
		if err := s.Finish(hold, tx); err != nil {
			return l.outlived(err)
		}
		return l.outlived(l.release(hold, tx, s.Write, o.Acks))
	})
}

// outlived returns err, or ErrExpired with err as its cause if err is the
// end of the lock's own holding context (see holding): the decision took
// longer than its lock, whose expiry fences out its writes. Redis was
// there, and no caller's deadline ended it: that is neither an outage nor
// a caller's timeout.
func (l *lock) outlived(err error) error {
	switch {
	case err == nil, errors.Is(err, ErrExpired), errors.Is(err, ErrNotObtained),
		l.sent.IsZero(), time.Since(l.sent) < l.lifetime+holdGrace:
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: %w", ErrExpired, err)
	}
	return err
}
