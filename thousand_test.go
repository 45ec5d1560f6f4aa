//go:build linux

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

// A crowd on the default strategy: thousandClients clients call at once,
// then each makes thousandMore calls more, one after the other, with
// context.Background(), under a per-client rule of thousandLimit a minute.
const (
	thousandClients = 1000
	thousandMore    = 99
	thousandLimit   = 2
)

// TestThousandClients: on miniredis with ClockTTL (as the HTTP example
// runs it) and on a real Redis of the test's own, under Logs, every call of
// the crowd is decided (a slow decision is neither an outage nor an
// expired lock: Redis is up, and no caller set a deadline), and every
// client's Results are exact: its first thousandLimit calls admitted with
// Remaining counting down, the others denied with Remaining 0.
func TestThousandClients(t *testing.T) {
	if testing.Short() {
		t.Skip("a crowd of a thousand clients")
	}
	t.Run("miniredis", func(t *testing.T) {
		if raceOn {
			// The race detector slows miniredis's SCAN (it sorts every key
			// of the database per call) past any time a test may take:
			// scripts/test.sh runs this test again without it.
			t.Skip("miniredis under -race is too slow for a crowd: run without -race (make test does)")
		}
		m := miniredis.RunT(t)
		m.ClockTTL(true)
		testThousand(t, m.Addr())
	})
	t.Run("redis", func(t *testing.T) { testThousand(t, startRedis(t).Addr()) })
}

func testThousand(t *testing.T, addr string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := New(rdb, PerClient(Per(thousandLimit, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	failures := map[string]int{}
	wrong := 0
	for c := range thousandClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range 1 + thousandMore {
				res, err := b.Allow(context.Background(), "r", fmt.Sprint("c", c))
				problem := ""
				switch want := max(thousandLimit-1-i, 0); {
				case err != nil:
					problem = fmt.Sprintf("%v (kind %v)", err, Kind(err))
				case res.Allowed != (i < thousandLimit) || res.Remaining != want:
					problem = fmt.Sprintf("call %d: Allowed %v, Remaining %d, want %v, %d", i, res.Allowed, res.Remaining, i < thousandLimit, want)
				}
				if problem != "" {
					mu.Lock()
					failures[problem]++
					wrong++
					mu.Unlock()
				}
			}
		}()
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("%d calls in %v", thousandClients*(1+thousandMore), time.Since(began).Round(time.Millisecond))
	if wrong > 0 {
		t.Errorf("%d of %d calls failed or were wrong: %v", wrong, thousandClients*(1+thousandMore), failures)
	}
}
