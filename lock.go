package leakybucket

import (
	"context"
	"errors"
	"fmt"
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
//  1. SET key token NX PX ttl takes the lock.
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
// An uncontended holder pays one round trip for steps 1 and 2 together with
// the caller's first reads, and one for step 3.
type lock struct {
	key   string
	token string
	ttl   time.Duration
	retry redislock.RetryStrategy

	watching bool // a WATCH of ours is active on the connection
	held     bool // taken by us and not yet released
}

// newLock returns a lock on key; a nil retry strategy means NoRetry.
func newLock(key string, ttl time.Duration, retry redislock.RetryStrategy) *lock {
	if retry == nil {
		retry = redislock.NoRetry()
	}
	return &lock{key: key, token: uuid.NewString(), ttl: ttl, retry: retry}
}

// cleanupTimeout bounds the cleanup after an error, which runs even when
// the caller's context has ended: a lock left behind expires on its own.
const cleanupTimeout = 100 * time.Millisecond

// obtain takes the lock on tx's connection and runs the commands queued by
// read after it is taken and watched, in the same round trip when the lock is
// free. While the lock is busy it waits as the retry strategy says, until the
// context ends.
func (l *lock) obtain(ctx context.Context, tx *redis.Tx, read func(redis.Pipeliner)) error {
	var wait *time.Timer
	for first := true; ; first = false {
		ok, err := l.try(ctx, tx, first, read)
		if err != nil && ctx.Err() != nil {
			// The context ended while we waited for the lock, during a round
			// trip (with ContextTimeoutEnabled, as an I/O timeout).
			return fmt.Errorf("%w: %w: %w", ErrLockNotObtained, context.Cause(ctx), err)
		}
		if err != nil || ok {
			return err
		}
		backoff := l.retry.NextBackoff()
		if backoff <= 0 {
			return ErrLockNotObtained
		}
		if wait == nil {
			wait = time.NewTimer(backoff)
			defer wait.Stop()
		} else {
			wait.Reset(backoff)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrLockNotObtained, context.Cause(ctx))
		case <-wait.C:
		}
	}
}

// try makes one attempt. The first sends SET NX with WATCH, GET and the reads
// in one round trip. Later ones send SET NX alone, so that polling a busy
// lock costs the server little, and watch and read only once it is taken.
// Every attempt starts with UNWATCH: a failed attempt's WATCH would see the
// holder's release and abort our EXEC.
func (l *lock) try(ctx context.Context, tx *redis.Tx, first bool, read func(redis.Pipeliner)) (bool, error) {
	var set *redis.BoolCmd
	var watch *redis.Cmd
	var get *redis.StringCmd
	_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "unwatch")
		set = pipe.SetNX(ctx, l.key, l.token, l.ttl)
		if first {
			watch, get = l.watch(ctx, pipe, read)
		}
		return nil
	})
	l.watching = watch != nil && watch.Err() == nil
	if err := set.Err(); err != nil {
		return false, err
	}
	if !set.Val() {
		return false, nil
	}
	l.held = true // from here on, cleanup frees the lock on any error
	if watch == nil {
		_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			watch, get = l.watch(ctx, pipe, read)
			return nil
		})
		l.watching = watch.Err() == nil
	}
	if err := watch.Err(); err != nil {
		return false, err
	}
	token, err := get.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	if token != l.token {
		// Our lock expired between SET and WATCH: not ours any more.
		l.held = false
		return false, nil
	}
	return true, nil
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
		return nil
	})
	switch {
	case err == nil:
		l.held, l.watching = false, false
	case errors.Is(err, redis.TxFailedErr):
		l.held, l.watching = false, false
		err = ErrLockExpired
	case redis.IsExecAbortError(err):
		// EXEC ran and dropped the WATCH, but applied nothing: the lock may
		// still be ours, and cleanup must check before deleting it.
		l.watching = false
	}
	return err
}

// cleanup runs after every decision. On success it has nothing to do. After
// an error it frees the lock if it is still ours, by compare-and-delete
// (WATCH, GET, MULTI DEL EXEC), and clears any WATCH, so that the connection
// goes back to the pool clean. It runs even when ctx has ended, for at most
// cleanupTimeout; if Redis cannot be reached, the lock expires on its own.
func (l *lock) cleanup(ctx context.Context, tx *redis.Tx) {
	if !l.held && !l.watching {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(l.ttl, cleanupTimeout))
	defer cancel()
	if l.held {
		l.held = false
		var get *redis.StringCmd
		_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.Do(ctx, "watch", l.key)
			get = pipe.Get(ctx, l.key)
			return nil
		})
		if get.Val() == l.token {
			// EXEC also drops the WATCH.
			_, _ = tx.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.Del(ctx, l.key)
				return nil
			})
			return
		}
	}
	_ = tx.Unwatch(ctx).Err()
}
