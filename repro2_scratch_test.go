package leakybucket

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func TestScratchThousand(t *testing.T) {
	calls := 1
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	b, _ := New(rdb, PerClient(Per(10, time.Minute)))
	var mu sync.Mutex
	errs := map[string]int{}
	admitted := map[string]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	t0 := time.Now()
	for c := range 1000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range calls {
				res, err := b.Allow(context.Background(), "r", fmt.Sprint("c", c))
				mu.Lock()
				if err != nil {
					errs[err.Error()]++
				} else if res.Allowed {
					admitted[fmt.Sprint(c)]++
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	t.Logf("took %v; errs %v", time.Since(t0), errs)
	bad := 0
	for c := range 1000 {
		if admitted[fmt.Sprint(c)] != 10 {
			bad++
		}
	}
	t.Logf("bad %d", bad)
}
