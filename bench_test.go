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
// is set, else on miniredis:
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

// BenchmarkAllowAmongKeys: sequential decisions, with at most 50 live logs, in a database
// that also holds 0 to 1 000 000 unrelated keys, to show what SCAN costs;
// it reports round trips per decision. Real Redis only: miniredis does not
// page. The keys are written under the benchmark's prefix and deleted after.
func BenchmarkAllowAmongKeys(b *testing.B) {
	if realAddr() == "" {
		b.Skipf("%s is not set", redisAddrVar)
	}
	rdb, prefix := benchClient(b)
	defer rdb.Close()
	defer cleanPrefix(rdb, prefix)
	trips := &roundTrips{}
	rdb.AddHook(trips)
	ctx := context.Background()
	filled := 0
	for _, size := range []int{0, 10_000, 100_000, 1_000_000} {
		for ; filled < size; filled += 10_000 {
			pipe := rdb.Pipeline()
			for i := filled; i < filled+10_000; i++ {
				pipe.Set(ctx, prefix+":unrelated:"+strconv.Itoa(i), "x", 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			bucket, err := New(rdb, WithPrefix(prefix), PerClient(Per(1<<30, time.Minute)))
			if err != nil {
				b.Fatal(err)
			}
			var decisionTrips int64
			for i := 0; b.Loop(); i++ {
				if i%50 == 0 { // keep 50 live logs at most: only the other keys grow
					b.StopTimer()
					if err := bucket.FlushAll(ctx, "r"); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				before := trips.n.Load()
				if _, err := bucket.Allow(ctx, "r", strconv.Itoa(i%50)); err != nil {
					b.Fatal(err)
				}
				decisionTrips += trips.n.Load() - before
			}
			b.ReportMetric(float64(decisionTrips)/float64(b.N), "trips/op")
		})
	}
}
