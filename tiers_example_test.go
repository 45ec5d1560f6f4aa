package leakybucket_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
)

// Free API keys may call 3 times a minute, pro keys 10 times. A key that
// upgrades keeps what it used (under Logs, the default, and Windows), and
// a tier's limit can change while the service runs.
func ExampleTiers() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	tiers, err := leakybucket.NewTiers(rdb, leakybucket.WithPrefix("api"))
	if err != nil {
		log.Fatal(err)
	}
	if err := tiers.Set("free", leakybucket.PerClient(leakybucket.PerMinute(3))); err != nil {
		log.Fatal(err)
	}
	if err := tiers.Set("pro", leakybucket.PerClient(leakybucket.PerMinute(10))); err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	for _, tier := range []string{"free", "free", "free", "free", "pro"} {
		res, err := tiers.Allow(ctx, tier, "GET /search", "key-42")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: allowed %v, %d left\n", tier, res.Allowed, res.Remaining)
	}

	// Later, without a restart: free gets 5 a minute.
	if err := tiers.Set("free", leakybucket.PerClient(leakybucket.PerMinute(5))); err != nil {
		log.Fatal(err)
	}
	res, err := tiers.Allow(ctx, "free", "GET /search", "key-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("free: allowed %v, %d left\n", res.Allowed, res.Remaining)
	// Output:
	// free: allowed true, 2 left
	// free: allowed true, 1 left
	// free: allowed true, 0 left
	// free: allowed false, 0 left
	// pro: allowed true, 6 left
	// free: allowed true, 0 left
}
