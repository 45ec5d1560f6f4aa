package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// naive is the obvious form of this library's design, kept here as a
// baseline: a bsm/redislock Lock (a Lua script to obtain, one to release)
// around a SCAN MATCH count of the client's logs and a SET PX of a new log.
// It waits for a busy lock as the library does by default. Nothing fences
// its write: if the lock expires during a slow SCAN, two decisions may
// overlap.
type naive struct {
	rdb    *redis.Client
	locker *redislock.Client
	limit  int
	window time.Duration
}

// The lock TTL and SCAN COUNT of the baseline: the library's defaults
// (WithLockTTL, WithScanCount).
const (
	naiveLockTTL   = 2 * time.Second
	naiveScanCount = 1000
)

func newNaive(rdb *redis.Client, limit int, window time.Duration) *naive {
	return &naive{rdb: rdb, locker: redislock.New(rdb), limit: limit, window: window}
}

// Allow: resource and client are plain [a-z0-9-] here, so the MATCH
// pattern needs no escaping.
func (n *naive) Allow(ctx context.Context, resource, client string) (bool, error) {
	base := "naive:{" + resource + "}:"
	lock, err := n.locker.Obtain(ctx, base+"lock:"+client, naiveLockTTL,
		&redislock.Options{RetryStrategy: &jittered{next: time.Millisecond, max: 16 * time.Millisecond}})
	if err != nil {
		return false, err
	}
	allowed, err := n.decide(ctx, base+"log:"+client+":")
	if rerr := lock.Release(context.WithoutCancel(ctx)); rerr != nil && err == nil {
		err = fmt.Errorf("release: %w", rerr)
	}
	return allowed, err
}

func (n *naive) decide(ctx context.Context, logs string) (bool, error) {
	seen := map[string]struct{}{} // SCAN may return a key twice
	var cursor uint64
	for {
		keys, next, err := n.rdb.Scan(ctx, cursor, logs+"*", naiveScanCount).Result()
		if err != nil {
			return false, err
		}
		for _, k := range keys {
			seen[k] = struct{}{}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if len(seen) >= n.limit {
		return false, nil
	}
	if err := n.rdb.Set(ctx, logs+strconv.FormatUint(rand.Uint64(), 36), "", n.window).Err(); err != nil {
		return false, err
	}
	return true, nil
}

// jittered is the library's default wait for a busy lock (WithLockWait):
// 1 ms doubling up to 16 ms, each wait drawn within ±25 %.
type jittered struct{ next, max time.Duration }

func (j *jittered) NextBackoff() time.Duration {
	d := j.next
	j.next = min(2*j.next, j.max)
	return d - d/4 + rand.N(d/2+1)
}
