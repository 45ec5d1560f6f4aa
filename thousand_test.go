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
// context.Background(), under a per-client rule of thousandLimit an hour.
// The window must outlast the run: on a loaded machine most of a run
// passes before a client's third call (its first denial waits behind a
// thousand clients' lock turns; the denial cache answers the calls after
// it), and a run of 3 minutes made calls 3 to 9 more than a minute after
// a client's first, which a minute's window then rightly admitted.
const (
	thousandClients = 1000
	thousandMore    = 99
	thousandLimit   = 2
	thousandWindow  = time.Hour
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
	b, err := New(rdb, PerClient(Per(thousandLimit, thousandWindow)))
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	failures := map[string]int{}
	wrong := 0
	admitted := make([][]admission, thousandClients) // by client, in order
	for c := range thousandClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range 1 + thousandMore {
				called := time.Now()
				res, err := b.Allow(context.Background(), "r", fmt.Sprint("c", c))
				if err == nil && res.Allowed {
					admitted[c] = append(admitted[c], admission{start: called, reply: time.Now(), weight: 1})
				}
				problem := ""
				switch want := max(thousandLimit-1-i, 0); {
				case err != nil:
					problem = err.Error()
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
		t.Log(thousandSpans(admitted, thousandWindow))
	}
}

// thousandSpans tells a limiter that over-admitted from a run that
// outlasted the window, for a failure's message: a client's admissions
// past its limit are proven over-admissions only if thousandLimit+1 of
// them, call to reply, lie within one window. Under a loaded machine the
// crowd's first calls (every one a decision in Redis, before any denial
// is cached) can take longer than the window, which then slides, and
// admits again, rightly.
func thousandSpans(admitted [][]admission, window time.Duration) string {
	proven, shortest := 0, time.Duration(-1)
	for _, adm := range admitted {
		for k := thousandLimit; k < len(adm); k++ {
			span := adm[k].reply.Sub(adm[k-thousandLimit].start)
			if span < window {
				proven++
			}
			if shortest < 0 || span < shortest {
				shortest = span
			}
		}
	}
	return fmt.Sprintf("proven over-admissions (%d admissions of a client within %v, call to reply): %d; the shortest span holding %d of a client's admissions: %v",
		thousandLimit+1, window, proven, thousandLimit+1, shortest)
}
