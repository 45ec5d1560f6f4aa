package inflight_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/inflight"
)

// At most 2 exports run at once per tenant, across every process; a
// third waits for one to finish, or gives up when its context ends.
func Example() {
	m, _ := miniredis.Run()
	defer m.Close()
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()

	exports, _ := inflight.New(rdb, inflight.PerClient(2), inflight.WithTTL(time.Minute))
	ctx := context.Background()

	first, _ := exports.Acquire(ctx, "export", "tenant-42")
	second, _ := exports.Acquire(ctx, "export", "tenant-42")
	_, ok, _ := exports.TryAcquire(ctx, "export", "tenant-42")
	fmt.Println("a third at once:", ok)

	// A long export keeps its lease alive while it runs; a crashed one
	// stops counting after its TTL.
	stop, cancel := context.WithCancel(ctx)
	first.KeepAlive(stop)

	go func() {
		time.Sleep(10 * time.Millisecond)
		second.Release(ctx) // the third is woken at once
	}()
	third, err := exports.Acquire(ctx, "export", "tenant-42")
	fmt.Println("the third, after a release:", err == nil)

	cancel()
	first.Release(ctx)
	third.Release(ctx)
	err = second.Release(ctx)
	fmt.Println("released twice:", errors.Is(err, inflight.ErrNotHeld))
	// Output:
	// a third at once: false
	// the third, after a release: true
	// released twice: true
}
