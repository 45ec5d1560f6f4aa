package leakybucket_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leakybucket/leakybucket"
)

// A job is admitted, then fails downstream: its weight is given back, so
// that the client's room is as if it had never run. In process here; on
// Redis, New(rdb, ...) answers the same.
func ExampleBucket_Refund() {
	// Each client may run 3 jobs an hour (a leaky bucket: GCRA).
	limiter, err := leakybucket.NewLocal(leakybucket.WithStrategy(leakybucket.GCRA),
		leakybucket.PerClient(leakybucket.Per(3, time.Hour)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	run := func(fails bool) {
		adm, res, err := limiter.Admit(ctx, "export", "client-9", 1)
		switch {
		case err != nil:
			log.Fatal(err)
		case !res.Allowed:
			fmt.Println("denied")
			return
		}
		if !fails {
			fmt.Println("ran")
			return
		}
		back, err := limiter.Refund(ctx, adm, 1)
		if err != nil {
			log.Fatal(err)
		}
		again, _ := limiter.Refund(ctx, adm, 1) // once only
		fmt.Printf("failed: %d given back, then %d\n", back, again)
	}
	run(true)
	run(false)
	run(false)
	run(true)
	run(false)
	run(false)

	// Only GCRA gives weight back so far.
	other, _ := leakybucket.NewLocal(leakybucket.PerClient(leakybucket.Per(3, time.Hour)))
	if _, _, err := other.Admit(ctx, "export", "client-9", 1); errors.Is(err, errors.ErrUnsupported) {
		fmt.Println("Logs: unsupported")
	}
	// Output:
	// failed: 1 given back, then 0
	// ran
	// ran
	// failed: 1 given back, then 0
	// ran
	// denied
	// Logs: unsupported
}
