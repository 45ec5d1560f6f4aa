package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/httprate"
	httprateredis "github.com/go-chi/httprate-redis"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// The peers a user picks instead when Lua is off: limiters that send
// Redis plain commands only. They run on the library's server, whose
// default user is denied scripting, which proves they need none.

// Names of their rows.
const (
	httprateName = "httprate-redis (MGET, then MULTI)"
	rollingName  = "rolling-rate-limiter (MULTI sorted set, in Go)"
)

func noLuaPeers() []impl {
	return []impl{
		{
			// Not exact: an approximate sliding window, and a read then a
			// write; see fixedWindowsBound and httpRate.
			name: httprateName, bound: fixedWindowsBound,
			overAdmits: "OnLimit takes the window before its mutex and counts the call in it after",
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				return newHTTPRate(rdb, limit, window), nil
			},
		},
		{
			name: rollingName, bound: windowBound, exact: true,
			make: func(rdb *redis.Client, limit int, window time.Duration) (limiter, error) {
				return rollingLog{rdb: rdb, limit: limit, window: window}, nil
			},
		},
	}
}

// fixedWindowsBound: httprate counts calls in fixed windows (aligned to the
// clock, not to the first call) and admits a call while the previous
// window's count, weighted by how much of it the sliding window still
// covers, plus the current window's stays within the limit. So each fixed
// window admits at most the limit, and a span of length elapsed touches at
// most elapsed/window + 2 of them.
func fixedWindowsBound(limit int, window, elapsed time.Duration) int64 {
	return int64(limit) * (int64(elapsed/window) + 2)
}

// httpRate is go-chi/httprate's limiter on go-chi/httprate-redis's
// counter, called as a service would: through RateLimiter.OnLimit, with a
// request and a response whose headers it sets. OnLimit reads both
// windows' counters (MGET), then, if the call is admitted, raises the
// current one (MULTI INCRBY EXPIRE EXEC), all under one mutex of the
// RateLimiter, held across both round trips, for every key. Two processes
// may both read room for one more and both raise: it is not exact across
// processes. Nor within one: OnLimit takes the current window before it
// locks the mutex, and counts an admitted call in that window after, so a
// call that waited for the mutex across a window's end is decided on the
// new window's counts but counted in the old one (the bench has seen a
// client get 146 where its bound is 120). The counter's fallback to a counter in this process, when
// Redis errs or is slow, is turned off: every decision here is Redis's.
// It takes no context: its commands run under the client's own timeouts.
type httpRate struct {
	rl  *httprate.RateLimiter
	req *http.Request
}

func newHTTPRate(rdb *redis.Client, limit int, window time.Duration) httpRate {
	counter := httprateredis.NewCounter(&httprateredis.Config{Client: rdb, FallbackDisabled: true, PrefixKey: "httprate"})
	rl := httprate.NewRateLimiter(limit, window, httprate.WithLimitCounter(counter),
		httprate.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) { w.(*headersOnly).err = err }))
	return httpRate{rl: rl, req: &http.Request{Method: http.MethodGet, Header: http.Header{}}}
}

func (h httpRate) Allow(ctx context.Context, resource, client string) (bool, error) {
	return h.AllowN(ctx, resource, client, 1)
}

// AllowN asks n through httprate's WithIncrement.
func (h httpRate) AllowN(ctx context.Context, resource, client string, n int) (bool, error) {
	if n != 1 {
		ctx = httprate.WithIncrement(ctx, n)
	}
	w := &headersOnly{h: http.Header{}}
	limited := h.rl.OnLimit(w, h.req.WithContext(ctx), resource+":"+client)
	if w.err != nil {
		return false, w.err
	}
	return !limited, nil
}

// headersOnly is the response OnLimit writes its headers to, and its
// error handler the error.
type headersOnly struct {
	h   http.Header
	err error
}

func (w *headersOnly) Header() http.Header         { return w.h }
func (w *headersOnly) Write(b []byte) (int, error) { return len(b), nil }
func (w *headersOnly) WriteHeader(int)             {}

// rollingLog is the sliding log of rolling-rate-limiter (npm, by Peter
// Khayes: RedisRateLimiter in its src/index.ts), its algorithm written
// here in Go: one MULTI/EXEC per call that drops the key's entries older
// than the window (ZREMRANGEBYSCORE 0 now-window), adds this call's
// (ZADD, the time in µs as score, a random UUID as member), reads every
// entry (ZRANGE 0 -1 WITHSCORES) and renews the key's expiry (EXPIRE, the
// window in whole seconds rounded up). The call is denied when the set
// then holds more entries than the limit. A denied call's entry stays, so
// denied calls count: a client calling past its limit stays denied until
// it stops for a window. The original reads a monotonic clock of its own
// process (process.hrtime); this reads the wall clock in µs, which at
// least agrees across the processes of one machine.
type rollingLog struct {
	rdb    *redis.Client
	limit  int
	window time.Duration
}

func (l rollingLog) Allow(ctx context.Context, resource, client string) (bool, error) {
	now := time.Now().UnixMicro()
	key := "rolling:" + resource + ":" + client
	var entries *redis.ZSliceCmd
	_, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, key, "0", strconv.FormatInt(now-l.window.Microseconds(), 10))
		p.ZAdd(ctx, key, redis.Z{Score: float64(now), Member: uuid.NewString()})
		entries = p.ZRangeWithScores(ctx, key, 0, -1)
		p.Expire(ctx, key, time.Duration(math.Ceil(l.window.Seconds()))*time.Second)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("rolling log: %w", err)
	}
	return len(entries.Val()) <= l.limit, nil
}
