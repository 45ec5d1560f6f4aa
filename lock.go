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
//     so from here on any change to the key, including its expiry (Redis >= 6.2
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

	watching bool // a WATCH may be active on the connection
	held     bool // obtained and not yet released
}

func newLock(key string, ttl time.Duration, retry redislock.RetryStrategy) *lock {
	return &lock{key: key, token: uuid.NewString(), ttl: ttl, retry: retry}
}

// obtain takes the lock on tx's connection and runs the commands queued by
// read after it is taken and watched, in the same round trip when the lock is
// free. While the lock is busy it waits as the retry strategy says, until the
// context ends.
func (l *lock) obtain(ctx context.Context, tx *redis.Tx, read func(redis.Pipeliner)) error {
	var wait *time.Timer
	for first := true; ; first = false {
		ok, err := l.try(ctx, tx, first, read)
		if err != nil {
			return err
		}
		if ok {
			l.held = true
			return nil
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
// lock costs the server one command, and watch and read only once it is
// taken.
func (l *lock) try(ctx context.Context, tx *redis.Tx, first bool, read func(redis.Pipeliner)) (bool, error) {
	var set *redis.BoolCmd
	var get *redis.StringCmd
	_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		if l.watching {
			// The WATCH of a failed first attempt: the holder's release
			// would abort our EXEC.
			pipe.Do(ctx, "unwatch")
		}
		set = pipe.SetNX(ctx, l.key, l.token, l.ttl)
		if first {
			get = l.watch(ctx, pipe, read)
		}
		return nil
	})
	l.watching = first
	if err := set.Err(); err != nil {
		return false, err
	}
	if !set.Val() {
		return false, nil
	}
	if get == nil {
		_, _ = tx.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			get = l.watch(ctx, pipe, read)
			return nil
		})
		l.watching = true
	}
	token, err := get.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, err
	}
	// Another token, or none: our lock expired between SET and WATCH.
	return token == l.token, nil
}

func (l *lock) watch(ctx context.Context, pipe redis.Pipeliner, read func(redis.Pipeliner)) *redis.StringCmd {
	pipe.Do(ctx, "watch", l.key)
	get := pipe.Get(ctx, l.key)
	read(pipe)
	return get
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
	case errors.Is(err, redis.TxFailedErr):
		err = ErrLockExpired
	default:
		return err // EXEC may not have run: cleanup frees what is left
	}
	l.held, l.watching = false, false
	return err
}

// cleanup returns the connection as it found it after an error: it frees the
// lock if still held (a compare-and-delete, thanks to the WATCH) and clears
// any WATCH. It runs even when ctx is cancelled; if Redis cannot be reached,
// the lock expires on its own.
func (l *lock) cleanup(ctx context.Context, tx *redis.Tx) {
	if !l.held && !l.watching {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.ttl)
	defer cancel()
	if l.held {
		_ = l.release(ctx, tx, func(redis.Pipeliner) {})
	} else {
		_ = tx.Unwatch(ctx).Err()
	}
}
