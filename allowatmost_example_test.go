package leakybucket_test

import (
	"context"
	"fmt"
	"log"
	"math"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
)

// A worker draining a queue asks how many of its messages it may send now,
// and sends that many: one decision, however many other workers ask at
// the same time.
func ExampleBucket_AllowAtMost() {
	// An in-memory Redis for this example: pass New your own client.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	// Each tenant may send 10 messages a minute.
	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(10)))
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	queued := 25
	for range 3 {
		res, err := limiter.AllowAtMost(ctx, "send", "tenant-7", queued)
		if err != nil {
			log.Fatal(err)
		}
		if !res.Allowed {
			fmt.Printf("none now; retry in %.0fs\n", math.Ceil(res.RetryAfter.Seconds()))
			break
		}
		queued -= res.Admitted
		fmt.Printf("send %d, %d still queued\n", res.Admitted, queued)
	}
	// Output:
	// send 10, 15 still queued
	// none now; retry in 60s
}
