package lock

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
)

// holdGrace is how long after the lock's deadline its holder's round trips
// and the background release go on.
const holdGrace = time.Second

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
	backoff.New(freeFirstBackoff, freeMaxBackoff).Retry(ctx, func() bool { return l.compareAndDelete(ctx) })
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
