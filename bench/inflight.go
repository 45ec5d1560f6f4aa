package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/inflight"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"
)

// The in-flight table: package inflight's acquisitions and releases, on
// the scripting-denied server, against a Lua semaphore with leases on the
// server that allows scripting, and golang.org/x/sync/semaphore in
// process, the floor of any semaphore. Goroutines acquire one permit of N,
// hold it a while, release it, and again, until the cell ends.

// inflightSpec is one cell's workload.
type inflightSpec struct {
	Goroutines, N int
	Hold          time.Duration // how long a permit is held
}

var (
	fullInflight  = inflightSpecs([]int{8, 32}, []int{10, 100}, []time.Duration{0, time.Millisecond})
	quickInflight = []inflightSpec{{Goroutines: 8, N: 10}}
)

// inflightSpecs is every combination of goroutines, N and hold.
func inflightSpecs(goroutines, ns []int, holds []time.Duration) []inflightSpec {
	var out []inflightSpec
	for _, g := range goroutines {
		for _, n := range ns {
			for _, h := range holds {
				out = append(out, inflightSpec{Goroutines: g, N: n, Hold: h})
			}
		}
	}
	return out
}

// inflightRow is one implementation's figures in one cell.
type inflightRow struct {
	Impl string
	Spec inflightSpec
	// Pairs are the acquisitions released in the cell, Rate their rate.
	Pairs    int64
	Rate     float64
	P50, P99 time.Duration // of an acquisition, its wait included
	// Round trips per acquisition and per release.
	AcquireTrips, ReleaseTrips float64
	MostHeld                   int64 // the most permits held at once
	Errors                     int64
	FirstErr                   string
	Check                      string
	Violation                  bool // more than N were held at once
}

// A permits is a semaphore of the table: acquire waits for a permit until
// ctx ends and returns what release takes back.
type permits interface {
	acquire(ctx context.Context) (any, error)
	release(ctx context.Context, permit any) error
	close()
}

// Names of the table's rows.
const (
	inflightName  = "leakybucket inflight (MULTI/EXEC, no Lua)"
	luaSemName    = "Lua semaphore (Redisson's expirable semaphore)"
	xsemaphoreNam = "x/sync/semaphore, in process"
)

// inflightImpls are the table's rows: each makes its semaphore of n
// permits on rdb (which the in-process one ignores).
func inflightImpls() []struct {
	name      string
	scripting bool
	newP      func(ctx context.Context, rdb *redis.Client, n int) (permits, error)
} {
	return []struct {
		name      string
		scripting bool
		newP      func(ctx context.Context, rdb *redis.Client, n int) (permits, error)
	}{
		{inflightName, false, newInflightPermits},
		{luaSemName, true, newLuaSemaphore},
		{xsemaphoreNam, false, func(_ context.Context, _ *redis.Client, n int) (permits, error) {
			return weighted{semaphore.NewWeighted(int64(n))}, nil
		}},
	}
}

// leaseTTL is every lease's time to live: far longer than a cell, so that
// none expires while held.
const leaseTTL = time.Minute

// inflightPermits is package inflight, one limit of n on one resource.
type inflightPermits struct{ l *inflight.Limiter }

func newInflightPermits(_ context.Context, rdb *redis.Client, n int) (permits, error) {
	l, err := inflight.New(rdb, inflight.PerResource(n), inflight.WithTTL(leaseTTL))
	return inflightPermits{l}, err
}

func (p inflightPermits) acquire(ctx context.Context) (any, error) {
	return p.l.Acquire(ctx, "bench", "client")
}

func (p inflightPermits) release(ctx context.Context, permit any) error {
	return permit.(*inflight.Lease).Release(ctx)
}

func (inflightPermits) close() {}

// weighted is golang.org/x/sync/semaphore's Weighted, one permit a call.
type weighted struct{ w *semaphore.Weighted }

func (w weighted) acquire(ctx context.Context) (any, error) { return nil, w.w.Acquire(ctx, 1) }
func (w weighted) release(context.Context, any) error       { w.w.Release(1); return nil }
func (weighted) close()                                     {}

// inflightTable is the in-flight table: its measurement and its report, below.
var inflightTable = tableOf("inflight", "In flight", func(res *results) *[]inflightRow { return &res.inflight }, report[inflightRow]{
	measure:  (*runner).inflightAll,
	markdown: inflightTableMD, title: "In flight", method: inflightMethod,
	checked: "in flight", check: func(r inflightRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// inflightAll measures the in-flight table.
func (r *runner) inflightAll(ctx context.Context) ([]inflightRow, error) {
	var out []inflightRow
	for _, spec := range r.cfg.inflight {
		for _, im := range inflightImpls() {
			if !r.cfg.impl.MatchString(im.name) {
				continue
			}
			s := r.lib
			if im.scripting {
				s = r.peers
			}
			row, err := r.inflightCell(ctx, s, im.name, im.newP, spec)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", im.name, spec, err)
			}
			fmt.Fprintf(r.log, "bench: in flight %-48s %s %10s pairs/s  p50 %8s  p99 %8s  %.2f+%.2f round trips  most held %d\n",
				im.name, spec, rate(row.Rate), fine(row.P50), fine(row.P99), row.AcquireTrips, row.ReleaseTrips, row.MostHeld)
			out = append(out, row)
		}
	}
	return out, nil
}

func (s inflightSpec) String() string {
	return fmt.Sprintf("%d goroutines, N = %d, held %v", s.Goroutines, s.N, s.Hold)
}

// inflightCell runs one cell on s's server, which it empties first.
func (r *runner) inflightCell(ctx context.Context, s *side, name string,
	newP func(context.Context, *redis.Client, int) (permits, error), spec inflightSpec) (inflightRow, error) {
	if err := s.empty(ctx); err != nil {
		return inflightRow{}, err
	}
	if err := warmPool(ctx, s.client, spec.Goroutines); err != nil {
		return inflightRow{}, err
	}
	p, err := newP(ctx, s.client, spec.N)
	if err != nil {
		return inflightRow{}, err
	}
	defer p.close()
	row := holdOut(ctx, p, spec, r.cfg.cell, r.cfg.timeout)
	row.Impl = name
	if row.Pairs == 0 {
		return row, fmt.Errorf("no permit was acquired and released: %d errors, the first: %s", row.Errors, row.FirstErr)
	}
	return row, nil
}

// holdTally is what the goroutines of a cell add up.
type holdTally struct {
	mu                   sync.Mutex
	latencies            []int64
	errs                 int64
	firstErr             string
	held, most           atomic.Int64
	acquireT, releaseT   atomic.Int64 // round trips
	acquired, releasedOK atomic.Int64
}

// fail counts an error.
func (t *holdTally) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.errs == 0 {
		t.firstErr = err.Error()
	}
	t.errs++
}

// hold counts a permit held, and the most held at once.
func (t *holdTally) hold() {
	h := t.held.Add(1)
	for m := t.most.Load(); h > m && !t.most.CompareAndSwap(m, h); m = t.most.Load() {
	}
}

// holdOut runs spec's goroutines for d: each acquires a permit, holds it
// for spec.Hold, releases it, and again, until d has passed; a call still
// waiting then finishes. Every call has at most timeout. A permit counts
// as held from the acquisition's return to the start of its release, so
// that more than N held at once is an over-admission.
func holdOut(ctx context.Context, p permits, spec inflightSpec, d, timeout time.Duration) inflightRow {
	var t holdTally
	ctx, cancel := context.WithTimeout(ctx, d+timeout)
	defer cancel()
	actx, rctx := withPhase(ctx, &t.acquireT), withPhase(ctx, &t.releaseT)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range spec.Goroutines {
		wg.Go(func() {
			var lat []int64
			for time.Now().Before(end) && ctx.Err() == nil {
				lat = append(lat, t.pair(actx, rctx, p, spec.Hold))
			}
			t.mu.Lock()
			t.latencies = append(t.latencies, lat...)
			t.mu.Unlock()
		})
	}
	wg.Wait()
	return t.row(spec, time.Since(start))
}

// pair acquires, holds and releases one permit, and returns how long the
// acquisition took.
func (t *holdTally) pair(actx, rctx context.Context, p permits, hold time.Duration) int64 {
	t0 := time.Now()
	permit, err := p.acquire(actx)
	took := time.Since(t0).Nanoseconds()
	if err != nil {
		t.fail(err)
		return took
	}
	t.acquired.Add(1)
	t.hold()
	if hold > 0 {
		time.Sleep(hold)
	}
	t.held.Add(-1)
	if err := p.release(rctx, permit); err != nil {
		t.fail(err)
		return took
	}
	t.releasedOK.Add(1)
	return took
}

// row is the cell's figures.
func (t *holdTally) row(spec inflightSpec, elapsed time.Duration) inflightRow {
	lat := sortedDurations(t.latencies)
	pairs := t.releasedOK.Load()
	row := inflightRow{Spec: spec, Pairs: pairs, Rate: float64(pairs) / elapsed.Seconds(),
		P50: percentile(lat, 50), P99: percentile(lat, 99),
		AcquireTrips: float64(t.acquireT.Load()) / float64(max(t.acquired.Load(), 1)),
		ReleaseTrips: float64(t.releaseT.Load()) / float64(max(pairs, 1)),
		MostHeld:     t.most.Load(), Errors: t.errs, FirstErr: t.firstErr}
	row.Check = fmt.Sprintf("%d <= %d", row.MostHeld, spec.N)
	if row.MostHeld > int64(spec.N) {
		row.Check, row.Violation = fmt.Sprintf("OVER: %d > %d held at once", row.MostHeld, spec.N), true
	}
	return row
}

// inflightTableMD is the in-flight table.
func inflightTableMD(_ config, rows []inflightRow) string {
	return markdownTable("| implementation | goroutines | N | held | pairs | pairs/s | acquire p50 | acquire p99 | round trips / acquire | round trips / release | most held at once | errors |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n", rows, func(r inflightRow) string {
		return fmt.Sprintf("| %s | %d | %d | %v | %s | %s | %v | %v | %.2f | %.2f | %s | %s |\n",
			r.Impl, r.Spec.Goroutines, r.Spec.N, r.Spec.Hold, thousands(r.Pairs), rate(r.Rate),
			fine(r.P50), fine(r.P99), r.AcquireTrips, r.ReleaseTrips, r.Check, errorsCell(r.Errors, r.FirstErr))
	})
}

// inflightMethod says how the in-flight table is measured.
func inflightMethod(_ config, rows []inflightRow) string {
	return "Package `inflight` (at most N held at once, with leases) against the semaphores a user would take instead. " +
		"Each cell's goroutines acquire one permit of N on one resource, hold it (0: release at once; 1ms: `time.Sleep`), release it, and again, until the cell's time is up; " +
		"a pair is one acquisition released, p50 and p99 are of an acquisition, its wait for a permit included. " +
		"Round trips are counted with the go-redis hook, apart for acquisitions and releases (by the call's context); " +
		"\"most held at once\" counts a permit from the acquisition's return to the start of its release and must not pass N. " +
		"**leakybucket inflight**: `inflight.New(rdb, PerResource(N), WithTTL(1m))`, `Acquire` and `Lease.Release`, on the scripting-denied server. " +
		"**Lua semaphore**: the algorithm of Redisson's `RPermitExpirableSemaphore` (Java; redisson/redisson, `RedissonPermitExpirableSemaphore`), written here as Lua from its description, not its code ([luasem.go](luasem.go)): " +
		"the free permits in a counter, the held ones in a sorted set scored by lease expiry; " +
		"an acquisition is one EVALSHA that first takes expired leases back, then takes a permit or returns how long until the earliest lease expires; " +
		"a release is one EVALSHA that removes the lease, frees its permit and publishes; a waiter is woken by that message, or at the earliest expiry, and tries again. " +
		"It runs through go-redis on the server that allows scripting. " +
		"**x/sync/semaphore**: `semaphore.NewWeighted(N)` in this process, no Redis: the floor."
}

// fine is round(d), except under a microsecond, where the in-process
// semaphore's acquisitions are: those keep their nanoseconds.
func fine(d time.Duration) string {
	if d < time.Microsecond {
		return d.String()
	}
	return round(d).String()
}
