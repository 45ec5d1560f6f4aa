package inflight

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Every behaviour test runs on five backends: in process (NewLocal),
// inside a testing/synctest bubble (fake time: sleeps are instant and
// exact), and, on the real clock, miniredis, a Ring of two miniredis, a
// real Redis whose
// user is denied scripting ($LEAKYBUCKET_REDIS_ADDR) and the real
// 3-master cluster ($LEAKYBUCKET_CLUSTER_ADDRS), as `make test` starts
// them. Without the addresses the real half is skipped, except under CI.

const (
	redisAddrVar    = "LEAKYBUCKET_REDIS_ADDR"
	clusterAddrsVar = "LEAKYBUCKET_CLUSTER_ADDRS"
)

// env is one backend for one test.
type env struct {
	name string
	rdb  redis.UniversalClient // nil in process
	fake bool                  // on synctest's fake time
	pfx  string
}

// limiter makes a Limiter on e's backend, on e's own prefix.
func (e *env) limiter(t *testing.T, opts ...Option) *Limiter {
	t.Helper()
	opts = append([]Option{WithPrefix(e.pfx)}, opts...)
	var l *Limiter
	var err error
	if e.rdb == nil {
		l, err = NewLocal(opts...)
	} else {
		l, err = New(e.rdb, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func uniquePrefix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ift" + hex.EncodeToString(b[:])
}

// forEach runs f on every backend.
func forEach(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("local", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { f(t, &env{name: "local", fake: true, pfx: uniquePrefix()}) })
	})
	t.Run("miniredis", func(t *testing.T) {
		f(t, &env{name: "miniredis", rdb: miniClient(t), pfx: uniquePrefix()})
	})
	t.Run("ring", func(t *testing.T) {
		rdb := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{
			"a": miniredis.RunT(t).Addr(), "b": miniredis.RunT(t).Addr(),
		}})
		t.Cleanup(func() { _ = rdb.Close() })
		f(t, &env{name: "ring", rdb: rdb, pfx: uniquePrefix()})
	})
	t.Run("redis", func(t *testing.T) {
		f(t, &env{name: "redis", rdb: realClient(t), pfx: uniquePrefix()})
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, &env{name: "cluster", rdb: clusterClient(t), pfx: uniquePrefix()})
	})
}

// miniClient is a client of a miniredis of its own, on the real clock
// (over TCP: fake time would need a pipe that never blocks).
func miniClient(t *testing.T) *redis.Client {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func needAddr(t testing.TB, v string) string {
	t.Helper()
	a := os.Getenv(v)
	if a == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("$%s is not set: CI must run the real-Redis tests", v)
		}
		t.Skipf("$%s is not set", v)
	}
	return a
}

func realClient(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: needAddr(t, redisAddrVar), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func clusterClient(t testing.TB) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(needAddr(t, clusterAddrsVar), ","), PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
