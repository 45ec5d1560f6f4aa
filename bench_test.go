package leakybucket

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Benchmarks of one Bucket, on the real Redis when $LEAKYBUCKET_REDIS_ADDR
// is set, else on miniredis. Comparisons with other libraries live in a
// module of their own, so that users never download them.
//
//	LEAKYBUCKET_REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench . -cpu 32

func benchClient(b *testing.B) (*redis.Client, string) {
	if addr := realAddr(); addr != "" {
		return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256}), uniquePrefix(b)
	}
	m := miniredis.RunT(b)
	return redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 256}), "bench"
}

// BenchmarkAllowDistinct: every call a different client, so no lock is
// contended; reports round trips per decision.
func BenchmarkAllowDistinct(b *testing.B) {
	rdb, prefix := benchClient(b)
	defer rdb.Close()
	defer cleanPrefix(rdb, prefix)
	trips := &roundTrips{}
	rdb.AddHook(trips)
	bucket, err := New(rdb, WithPrefix(prefix), PerClient(Per(1000, time.Minute)))
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			client := strconv.FormatInt(next.Add(1)%10000, 10)
			if _, err := bucket.Allow(context.Background(), "r", client); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(trips.n.Load())/float64(b.N), "trips/op")
}

// BenchmarkAllowHotKey: every call the same (resource, client), so every
// decision waits for the one lock.
func BenchmarkAllowHotKey(b *testing.B) {
	rdb, prefix := benchClient(b)
	defer rdb.Close()
	defer cleanPrefix(rdb, prefix)
	bucket, err := New(rdb, WithPrefix(prefix), PerClient(Per(1000, time.Minute)))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := bucket.Allow(context.Background(), "r", "hot"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
