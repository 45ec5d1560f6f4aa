package leakybucket_test

import (
	"context"
	"fmt"
	"log"
	"math"

	"github.com/leakybucket/leakybucket"
)

// A worker draining a queue asks how many of its messages it may send now,
// and sends that many: one decision, however many other workers ask at
// the same time. In process here; on Redis, New(rdb, ...) answers the same.
func ExampleBucket_AllowAtMost() {
	// Each tenant may send 10 messages a minute.
	limiter, err := leakybucket.NewLocal(leakybucket.PerClient(leakybucket.PerMinute(10)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	queued := 25
	for queued > 0 {
		res, err := limiter.AllowAtMost(ctx, "send", "tenant-7", queued)
		if err != nil {
			log.Fatal(err) // bad input, or the context ended
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
