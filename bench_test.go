package leakybucket

import (
	"context"
	"strconv"
	"sync"
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
//
// Each runs once per strategy. The peers are compared in the bench module.

// benchStrategies are the strategies the benchmarks compare, by name.
var benchStrategies = []struct {
	name     string
	strategy Strategy
}{
	{"logs", Logs},
	{"sortedset", SortedSet},
	{"windows", Windows(10 * time.Millisecond)},
}

// eachStrategy runs bench once per strategy.
func eachStrategy(b *testing.B, bench func(b *testing.B, s Strategy)) {
	for _, s := range benchStrategies {
		b.Run(s.name, func(b *testing.B) { bench(b, s.strategy) })
	}
}

func benchClient(b *testing.B) (*redis.Client, string) {
	if addr := realAddr(); addr != "" {
		return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256}), uniquePrefix(b)
	}
	m := miniredis.RunT(b)
	return redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 256}), "bench"
}

// BenchmarkAllowDistinct: every call a different client, so no lock is
// contended; reports round trips per decision.
func BenchmarkAllowDistinct(b *testing.B) { eachStrategy(b, benchmarkAllowDistinct) }

func benchmarkAllowDistinct(b *testing.B, s Strategy) {
	rdb, prefix := benchClient(b)
	defer rdb.Close()
	defer cleanPrefix(rdb, prefix)
	trips := &roundTrips{}
	rdb.AddHook(trips)
	bucket, err := New(rdb, WithStrategy(s), WithPrefix(prefix), PerClient(Per(1000, time.Minute)))
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
func BenchmarkAllowHotKey(b *testing.B) { eachStrategy(b, benchmarkAllowHotKey) }

func benchmarkAllowHotKey(b *testing.B, s Strategy) {
	rdb, prefix := benchClient(b)
	defer rdb.Close()
	defer cleanPrefix(rdb, prefix)
	bucket, err := New(rdb, WithStrategy(s), WithPrefix(prefix), PerClient(Per(1000, time.Minute)))
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

// BenchmarkAllowAmongKeys: sequential decisions in a database that also
// holds 0 to 1 000 000 unrelated keys, to show what each strategy pays for
// them; it reports round trips per decision. The window is 50ms, so that
// few calls are counted at once and only the other keys grow. Real Redis
// only: miniredis does not page SCAN. The keys are written under the
// benchmark's prefix and deleted after.
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
			eachStrategy(b, func(b *testing.B, s Strategy) {
				bucket, err := New(rdb, WithStrategy(s), WithPrefix(prefix), PerClient(Per(1<<30, 50*time.Millisecond)))
				if err != nil {
					b.Fatal(err)
				}
				var decisionTrips int64
				for i := 0; b.Loop(); i++ {
					before := trips.n.Load()
					if _, err := bucket.Allow(ctx, "r", strconv.Itoa(i%50)); err != nil {
						b.Fatal(err)
					}
					decisionTrips += trips.n.Load() - before
				}
				b.ReportMetric(float64(decisionTrips)/float64(b.N), "trips/op")
			})
		})
	}
}

// BenchmarkDatabaseSizeRatio measures what 1 000 000 unrelated keys cost a
// SortedSet or Windows decision, paired so that noise hits both sides: each
// iteration makes one decision in an empty logical database (1) and one in
// a database (2) holding the keys, and the benchmark reports the ratio of
// their mean times. Real Redis only; the keys are deleted after.
func BenchmarkDatabaseSizeRatio(b *testing.B) {
	if realAddr() == "" {
		b.Skipf("%s is not set", redisAddrVar)
	}
	ctx := context.Background()
	prefix := uniquePrefix(b)
	empty := redis.NewClient(&redis.Options{Addr: realAddr(), DB: 1})
	full := redis.NewClient(&redis.Options{Addr: realAddr(), DB: 2})
	defer empty.Close()
	defer full.Close()
	defer cleanPrefix(empty, prefix)
	defer cleanPrefix(full, prefix)
	for filled := 0; filled < 1_000_000; filled += 10_000 {
		pipe := full.Pipeline()
		for i := filled; i < filled+10_000; i++ {
			pipe.Set(ctx, prefix+":unrelated:"+strconv.Itoa(i), "x", 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for _, s := range benchStrategies[1:] {
		b.Run(s.name, func(b *testing.B) {
			var took [2]time.Duration
			buckets := make([]*Bucket, 2)
			for side, rdb := range []*redis.Client{empty, full} {
				var err error
				buckets[side], err = New(rdb, WithStrategy(s.strategy), WithPrefix(prefix), PerClient(Per(1<<30, 50*time.Millisecond)))
				if err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; b.Loop(); i++ {
				for side, bucket := range buckets {
					start := time.Now()
					if _, err := bucket.Allow(ctx, "r", strconv.Itoa(i%50)); err != nil {
						b.Fatal(err)
					}
					took[side] += time.Since(start)
				}
			}
			b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "ns/empty")
			b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "ns/1M")
			b.ReportMetric(float64(took[1])/float64(took[0]), "1M/empty")
		})
	}
}

// BenchmarkLocal: NewLocal as bench/'s in-process table measures it: 8
// goroutines, each over 10 000 keys in turn from its own start, every call
// admitted, with AllowNInto and one Result per goroutine, once a window of
// the same calls has filled each key's counts (a Bucket is kept, full, for
// the benchmark's later runs); reports allocations.
func BenchmarkLocal(b *testing.B) { eachStrategy(b, benchmarkLocal) }

// fullLocal is a NewLocal Bucket, its keys and where each goroutine is.
type fullLocal struct {
	bucket *Bucket
	keys   []string
	next   [8]int
}

var fullLocals sync.Map // by Strategy: *fullLocal

func benchmarkLocal(b *testing.B, s Strategy) {
	f, err := fullLocalOf(s)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	f.run(b, max(b.N/len(f.next), 1), 0)
}

// fullLocalOf returns s's full Bucket, made and filled on the first call.
func fullLocalOf(s Strategy) (*fullLocal, error) {
	if f, ok := fullLocals.Load(s); ok {
		return f.(*fullLocal), nil
	}
	bucket, err := NewLocal(WithStrategy(s), PerClient(Per(1_000_000, time.Second)))
	if err != nil {
		return nil, err
	}
	f := &fullLocal{bucket: bucket, keys: make([]string, 10_000)}
	for i := range f.keys {
		f.keys[i] = "client-" + strconv.Itoa(i)
	}
	for g := range f.next {
		f.next[g] = g * len(f.keys) / len(f.next)
	}
	f.run(nil, 0, time.Second)
	fullLocals.Store(s, f)
	return f, nil
}

// run makes n calls in each goroutine, or if n is 0 calls for d.
func (f *fullLocal) run(b *testing.B, n int, d time.Duration) {
	var wg sync.WaitGroup
	var stop atomic.Bool
	for g := range f.next {
		wg.Go(func() {
			ctx := context.Background()
			var res Result
			i := f.next[g]
			for k := 0; n == 0 && !stop.Load() || k < n; k++ {
				if err := f.bucket.AllowNInto(ctx, "r", f.keys[i%len(f.keys)], 1, &res); (err != nil || !res.Allowed) && b != nil {
					b.Errorf("AllowNInto = %+v, %v", res, err)
					return
				}
				i++
			}
			f.next[g] = i
		})
	}
	if n == 0 {
		time.Sleep(d)
		stop.Store(true)
	}
	wg.Wait()
}
