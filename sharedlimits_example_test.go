package leakybucket_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
)

// Two processes serve the "pro" tier, 10 calls a minute per API key in
// code, sharing its limits through Redis. During an incident one of them
// (or an operator: leakybucket limits set) lowers it to 3: the other
// follows within its refresh interval, and a key that already used 4 is
// denied at once; raised to 20, it is admitted again.
func ExampleTiers_SetLimits() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	serve := func() *leakybucket.Tiers { // what each process runs at start
		tiers, err := leakybucket.NewTiers(rdb, leakybucket.WithPrefix("api"),
			leakybucket.WithSharedLimits(time.Second))
		if err != nil {
			log.Fatal(err)
		}
		if err := tiers.Set("pro", leakybucket.PerClient(leakybucket.PerMinute(10))); err != nil {
			log.Fatal(err)
		}
		return tiers
	}
	one, other := serve(), serve()

	ctx := context.Background()
	call := func(tiers *leakybucket.Tiers) {
		res, err := tiers.Allow(ctx, "pro", "GET /search", "key-42")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed %v, %d left of %d\n", res.Allowed, res.Remaining, res.Rules[0].Rule.Limit.Requests)
	}
	for range 4 {
		call(other)
	}

	lower := leakybucket.Rule{PerClient: true, Limit: leakybucket.PerMinute(3)}
	if err := one.SetLimits(ctx, "pro", lower); err != nil {
		log.Fatal(err)
	}
	// The other reads the limits again once its copy is a second old; here,
	// at once.
	if err := other.Refresh(ctx); err != nil {
		log.Fatal(err)
	}
	call(other)

	raise := leakybucket.Rule{PerClient: true, Limit: leakybucket.PerMinute(20)}
	if err := one.SetLimits(ctx, "pro", raise); err != nil {
		log.Fatal(err)
	}
	if err := other.Refresh(ctx); err != nil {
		log.Fatal(err)
	}
	call(other)
	// Output:
	// allowed true, 9 left of 10
	// allowed true, 8 left of 10
	// allowed true, 7 left of 10
	// allowed true, 6 left of 10
	// allowed false, 0 left of 3
	// allowed true, 15 left of 20
}
