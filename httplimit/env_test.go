package httplimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// The tests run on miniredis, whose clock stands still at start unless a
// test moves it, so that every header value is exact; the concurrency test
// runs on the real Redis at $LEAKYBUCKET_REDIS_ADDR too (`make test`
// starts one). Without the address that part is skipped, except under CI,
// where it fails, as in the leakybucket package's own suite.

const redisAddrVar = "LEAKYBUCKET_REDIS_ADDR"

var start = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// miniClient returns a client of a fresh miniredis whose clock is frozen
// at start (move it with mr.SetTime), and the server.
func miniClient(t *testing.T) (*redis.Client, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(start)
	mr.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return rdb, mr
}

// realClient returns a client of the real Redis and a prefix of the
// test's own, whose keys are deleted afterwards; or skips the test (fails
// it under CI) when there is no real Redis. opts, if any, change the
// client's options first.
func realClient(t *testing.T, opts ...func(*redis.Options)) (*redis.Client, string) {
	t.Helper()
	addr := os.Getenv(redisAddrVar)
	if addr == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the real-Redis tests (use make test)", redisAddrVar)
		}
		t.Skipf("%s is not set; `make test` starts a scripting-denied Redis", redisAddrVar)
	}
	o := &redis.Options{Addr: addr, PoolSize: 64}
	for _, opt := range opts {
		opt(o)
	}
	rdb := redis.NewClient(o)
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "httplimit-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	})
	return rdb, prefix
}

// bucket returns a Bucket of rules on rdb.
func bucket(t *testing.T, rdb redis.UniversalClient, opts ...leakybucket.Option) *leakybucket.Bucket {
	t.Helper()
	b, err := leakybucket.New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentAddr returns a loopback address that accepts connections and
// never answers, as a paused Redis does.
func silentAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	return l.Addr().String()
}
