package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// luaSemaphore is the semaphore with leases a user with Lua would take:
// the algorithm of Redisson's RPermitExpirableSemaphore (the Java client
// redisson/redisson, its RedissonPermitExpirableSemaphore), written here
// from its description, not its code. The free permits are a counter; the
// held ones, each a random id, are a sorted set scored by the lease's
// expiry. An acquisition is one script: it takes the expired leases back
// into the counter (lazily: nothing else reclaims them), then takes the
// lease's permits (n, named in its id "n:uuid", as Redisson's acquire(n))
// if the counter has them, else returns how long until the earliest lease
// expires. A release is one script: it removes the lease and, if it was
// held, gives its permits back and publishes on the semaphore's channel. A waiter subscribes to that channel, as Redisson's do: each
// message wakes one waiter, which tries again; without one, it tries again
// when the earliest lease expires.
type luaSemaphore struct {
	rdb  *redis.Client
	keys []string // the counter, the sorted set, the channel
	sub  *redis.PubSub
	// waiting counts the callers between their first try and their
	// permit; wake holds one token per message received while any wait
	// (a token left over costs a waiter one more try).
	waiting atomic.Int64
	wake    chan struct{}
}

// luaAcquire: KEYS: the counter, the sorted set, the channel; ARGV: the
// new lease's id ("n:uuid", n its permits), its time to live in ms.
// Returns 0 when it took its permits, else the ms until the earliest
// lease expires (at least 1). Times are Redis's clock's.
var luaAcquire = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #expired > 0 then
  local freed = 0
  for _, id in ipairs(expired) do
    freed = freed + tonumber(string.match(id, '^(%d+):'))
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('INCRBY', KEYS[1], freed)
  redis.call('PUBLISH', KEYS[3], freed)
end
local n = tonumber(string.match(ARGV[1], '^(%d+):'))
if tonumber(redis.call('GET', KEYS[1]) or '0') >= n then
  redis.call('DECRBY', KEYS[1], n)
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
  return 0
end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 0 then
  return 1
end
return math.max(1, tonumber(first[2]) - now)
`)

// luaRelease: KEYS as luaAcquire's; ARGV: the lease's id. Returns 1 if it
// was held, else 0.
var luaRelease = redis.NewScript(`
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local n = tonumber(string.match(ARGV[1], '^(%d+):'))
redis.call('INCRBY', KEYS[1], n)
redis.call('PUBLISH', KEYS[3], n)
return 1
`)

// newLuaSemaphore sets the semaphore's n permits (Redisson's
// trySetPermits), subscribes to its channel and loads its scripts.
func newLuaSemaphore(ctx context.Context, rdb *redis.Client, n int) (permits, error) {
	s := &luaSemaphore{rdb: rdb, keys: []string{"sem:{bench}", "sem:{bench}:timeout", "sem:{bench}:channel"},
		wake: make(chan struct{}, 1024)}
	if err := rdb.SetNX(ctx, s.keys[0], n, 0).Err(); err != nil {
		return nil, err
	}
	s.sub = rdb.Subscribe(ctx, s.keys[2])
	if _, err := s.sub.Receive(ctx); err != nil {
		s.sub.Close()
		return nil, err
	}
	for _, sc := range []*redis.Script{luaAcquire, luaRelease} {
		if err := sc.Load(ctx, rdb).Err(); err != nil {
			s.sub.Close()
			return nil, err
		}
	}
	go s.listen(s.sub.Channel())
	return s, nil
}

// listen turns each message into a token for one waiter, while any wait.
func (s *luaSemaphore) listen(msgs <-chan *redis.Message) {
	for range msgs {
		if s.waiting.Load() == 0 {
			continue
		}
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (s *luaSemaphore) acquire(ctx context.Context) (any, error) { return s.acquireN(ctx, 1) }

// acquireN takes n permits; it counts itself among the waiters before its
// first try, so that no message sent after that try is lost to it.
func (s *luaSemaphore) acquireN(ctx context.Context, n int) (any, error) {
	id := strconv.Itoa(n) + ":" + uuid.NewString()
	ttl := leaseTTL.Milliseconds()
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	for {
		wait, err := luaAcquire.Run(ctx, s.rdb, s.keys, id, ttl).Int64()
		if err != nil || wait == 0 {
			return id, err
		}
		if err := s.await(ctx, time.Duration(wait)*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// await waits for a message's token, for d, or for ctx to end.
func (s *luaSemaphore) await(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.wake:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (s *luaSemaphore) release(ctx context.Context, permit any) error {
	held, err := luaRelease.Run(ctx, s.rdb, s.keys, permit).Int64()
	if err == nil && held == 0 {
		err = fmt.Errorf("lease %v was not held", permit)
	}
	return err
}

func (s *luaSemaphore) close() { s.sub.Close() }
