package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A workload is who calls and how: Keys distinct (resource, client) pairs,
// called round-robin by Goroutines goroutines, on an empty database.
type workload struct {
	Name       string
	Resource   string
	Keys       int
	Goroutines int
}

// client names the i-th key's client: plain [a-z0-9-], so that no MATCH
// pattern needs escaping.
func (w workload) client(i int) string {
	if w.Keys == 1 {
		return "hot"
	}
	return "client-" + strconv.Itoa(i)
}

// checkDistinct proves the workload's keys are distinct.
func (w workload) checkDistinct() error {
	seen := make(map[string]struct{}, w.Keys)
	for i := range w.Keys {
		seen[w.Resource+"\x00"+w.client(i)] = struct{}{}
	}
	if len(seen) != w.Keys {
		return fmt.Errorf("workload %q: %d keys wanted, %d distinct", w.Name, w.Keys, len(seen))
	}
	return nil
}

// loadResult is what one process measured in one cell.
type loadResult struct {
	Decisions int64
	Errors    int64
	FirstErr  string
	Admitted  []int64 // per key
	Decided   []int64 // per key
	Trips     int64
	Scripts   int64 // script commands sent
	Elapsed   time.Duration
	Latencies []int64 // ns, one per decision
}

// runLoad calls lim from w.Goroutines goroutines, starting at start, and
// issues no new call after d; each call may take up to timeout.
func runLoad(ctx context.Context, w workload, lim limiter, tr *trips, start time.Time, d, timeout time.Duration) loadResult {
	admitted := make([]atomic.Int64, w.Keys)
	decided := make([]atomic.Int64, w.Keys)
	var next, errCount atomic.Int64
	var firstErr atomic.Pointer[string]
	lats := make([][]int64, w.Goroutines)

	time.Sleep(time.Until(start))
	trips0, scripts0 := tr.n.Load(), tr.scripts.Load()
	t0 := time.Now()
	end := t0.Add(d)
	var wg sync.WaitGroup
	for g := range w.Goroutines {
		wg.Go(func() {
			lat := make([]int64, 0, 1024)
			for ctx.Err() == nil && time.Now().Before(end) {
				k := int((next.Add(1) - 1) % int64(w.Keys))
				cctx, cancel := context.WithTimeout(ctx, timeout)
				s := time.Now()
				ok, err := lim.Allow(cctx, w.Resource, w.client(k))
				lat = append(lat, int64(time.Since(s)))
				cancel()
				decided[k].Add(1)
				if ok {
					admitted[k].Add(1)
				}
				if err != nil {
					errCount.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	r := loadResult{
		Elapsed:  time.Since(t0),
		Trips:    tr.n.Load() - trips0,
		Scripts:  tr.scripts.Load() - scripts0,
		Errors:   errCount.Load(),
		Admitted: make([]int64, w.Keys),
		Decided:  make([]int64, w.Keys),
	}
	if p := firstErr.Load(); p != nil {
		r.FirstErr = *p
	}
	for i := range w.Keys {
		r.Admitted[i], r.Decided[i] = admitted[i].Load(), decided[i].Load()
		r.Decisions += r.Decided[i]
	}
	for _, l := range lats {
		r.Latencies = append(r.Latencies, l...)
	}
	return r
}
