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

// A leaky bucket (GCRA): each API key drains at one call a minute, and may
// call 3 times at once when its bucket is empty. Where a sliding window
// of 1 a minute would admit one call, the burst admits three; and then
// one a minute, evenly, never a minute's worth at once.
func ExampleLimit_WithBurst() {
	// An in-memory Redis for this example: pass New your own client.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb,
		leakybucket.WithStrategy(leakybucket.GCRA),
		leakybucket.PerClient(leakybucket.PerMinute(1).WithBurst(3)),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for range 4 {
		res, err := limiter.Allow(ctx, "POST /upload", "api-key-42")
		if err != nil {
			log.Fatal(err)
		}
		if !res.Allowed {
			fmt.Printf("denied: Retry-After: %.0f\n", math.Ceil(res.RetryAfter.Seconds()))
			continue
		}
		fmt.Printf("allowed: %d left, all 3 back in %.0f min\n", res.Remaining, math.Ceil(res.ResetAfter.Minutes()))
	}
	// Output:
	// allowed: 2 left, all 3 back in 1 min
	// allowed: 1 left, all 3 back in 2 min
	// allowed: 0 left, all 3 back in 3 min
	// denied: Retry-After: 60
}
