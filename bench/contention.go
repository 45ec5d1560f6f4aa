package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/leakybucket/leakybucket/inflight"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"
)

// The in-flight contention table: the short waits of a middleware, from
// several processes. Each of 4 clients (a go-redis client and a
// semaphore of its own: a process, as far as Redis and the semaphore can
// tell) runs 25 goroutines; each asks for a weight of 1 to 3 under a limit
// of 6, waits at most the cell's wait, holds what it got 5 to 15 ms, and
// releases it. What was held is measured from each lease's span (from the
// acquisition's return to the call of its release: a lower bound of what
// the server held).

// contentionSpec is one cell's workload.
type contentionSpec struct {
	Procs, Goroutines, N int
	Wait                 time.Duration
}

var (
	contentionWaits = []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second}
	fullContention  = contentionSpecs(contentionWaits)
	quickContention = contentionSpecs([]time.Duration{20 * time.Millisecond})
)

func contentionSpecs(waits []time.Duration) []contentionSpec {
	var out []contentionSpec
	for _, w := range waits {
		out = append(out, contentionSpec{Procs: 4, Goroutines: 25, N: 6, Wait: w})
	}
	return out
}

func (s contentionSpec) String() string {
	return fmt.Sprintf("%d x %d goroutines, N = %d, wait %v", s.Procs, s.Goroutines, s.N, s.Wait)
}

// contentionRow is one implementation's figures in one cell.
type contentionRow struct {
	Impl         string
	Spec         contentionSpec
	Leases       int64
	Rate         float64 // leases/s
	Share        float64 // the mean weight held over the limit, in %
	Least, Most  int64   // the leases of the least and the most served client
	MostHeld     int     // the most weight held at once
	RanOut       int64   // waits that ran out
	Errors       int64
	FirstErr     string
	Check        string
	Violation    bool
	Fair, Filled bool // the least served client had at least half the mean; 80 % held
}

// weightedPermits is a semaphore of the table: acquire waits at most wait
// for n permits, and returns nil if none came in time.
type weightedPermits interface {
	acquireN(ctx context.Context, n int, wait time.Duration) (any, error)
	release(ctx context.Context, permit any) error
	close()
}

// contentionImpls are the table's rows: each makes one client's semaphore
// of n permits on rdb (which the in-process one ignores; its clients share
// one semaphore).
func contentionImpls() []struct {
	name      string
	scripting bool
	newP      func(ctx context.Context, rdb *redis.Client, n int, shared *semaphore.Weighted) (weightedPermits, error)
} {
	return []struct {
		name      string
		scripting bool
		newP      func(ctx context.Context, rdb *redis.Client, n int, shared *semaphore.Weighted) (weightedPermits, error)
	}{
		{inflightName, false, func(_ context.Context, rdb *redis.Client, n int, _ *semaphore.Weighted) (weightedPermits, error) {
			l, err := inflight.New(rdb, inflight.PerResource(n), inflight.WithTTL(leaseTTL))
			return inflightPermits{l}, err
		}},
		{luaSemName, true, func(ctx context.Context, rdb *redis.Client, n int, _ *semaphore.Weighted) (weightedPermits, error) {
			p, err := newLuaSemaphore(ctx, rdb, n)
			if err != nil {
				return nil, err
			}
			return luaWithin{p.(*luaSemaphore)}, nil
		}},
		{xsemaphoreNam, false, func(context.Context, *redis.Client, int, *semaphore.Weighted) (weightedPermits, error) {
			return nil, nil // set by contentionCell: one semaphore for every client
		}},
	}
}

func (p inflightPermits) acquireN(ctx context.Context, n int, wait time.Duration) (any, error) {
	le, err := p.l.AcquireWithin(ctx, "bench", "client", n, wait)
	if le == nil {
		return nil, err // not a nil *Lease in a non-nil any
	}
	return le, err
}

// luaWithin is the Lua semaphore with a wait.
type luaWithin struct{ s *luaSemaphore }

func (l luaWithin) acquireN(ctx context.Context, n int, wait time.Duration) (any, error) {
	return withinWait(ctx, wait, func(ctx context.Context) (any, error) { return l.s.acquireN(ctx, n) })
}
func (l luaWithin) release(ctx context.Context, p any) error { return l.s.release(ctx, p) }
func (l luaWithin) close()                                   { l.s.close() }

// weightedWithin is x/sync/semaphore with a wait.
type weightedWithin struct{ w *semaphore.Weighted }

func (w weightedWithin) acquireN(ctx context.Context, n int, wait time.Duration) (any, error) {
	return withinWait(ctx, wait, func(ctx context.Context) (any, error) { return n, w.w.Acquire(ctx, int64(n)) })
}
func (w weightedWithin) release(_ context.Context, p any) error {
	w.w.Release(int64(p.(int)))
	return nil
}
func (weightedWithin) close() {}

// withinWait runs acquire within wait: a wait that runs out is no permit
// and no error.
func withinWait(ctx context.Context, wait time.Duration, acquire func(context.Context) (any, error)) (any, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	p, err := acquire(wctx)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, nil
	}
	return p, err
}

// contentionTable is the table: its measurement and its report, below.
var contentionTable = tableOf("inflight-contention", "In flight under contention", func(res *results) *[]contentionRow { return &res.contention }, report[contentionRow]{
	measure:  (*runner).contentionAll,
	markdown: contentionTableMD, title: "In flight under contention", method: contentionMethod,
	checked: "in flight under contention", check: func(r contentionRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// contentionAll measures the table.
func (r *runner) contentionAll(ctx context.Context) ([]contentionRow, error) {
	var out []contentionRow
	for _, spec := range r.cfg.contention {
		for _, im := range contentionImpls() {
			if !r.cfg.impl.MatchString(im.name) {
				continue
			}
			s := r.lib
			if im.scripting {
				s = r.peers
			}
			row, err := r.contentionCell(ctx, s, im.name, im.newP, spec)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", im.name, spec, err)
			}
			fmt.Fprintf(r.log, "bench: in flight under contention %-48s %s %8.0f leases/s  %5.1f%% held  clients %d..%d  most held %d\n",
				im.name, spec, row.Rate, row.Share, row.Least, row.Most, row.MostHeld)
			out = append(out, row)
		}
	}
	return out, nil
}

// contentionCell runs one cell on s's server, which it empties first:
// spec.Procs clients of their own, each with its own semaphore.
func (r *runner) contentionCell(ctx context.Context, s *side, name string,
	newP func(context.Context, *redis.Client, int, *semaphore.Weighted) (weightedPermits, error), spec contentionSpec) (contentionRow, error) {
	if err := s.empty(ctx); err != nil {
		return contentionRow{}, err
	}
	shared := semaphore.NewWeighted(int64(spec.N))
	var ps []weightedPermits
	for range spec.Procs {
		c := s.more()
		defer c.Close()
		if err := warmPool(ctx, c, spec.Goroutines); err != nil {
			return contentionRow{}, err
		}
		p, err := newP(ctx, c, spec.N, shared)
		if err != nil {
			return contentionRow{}, err
		}
		if p == nil {
			p = weightedWithin{shared}
		}
		defer p.close()
		ps = append(ps, p)
	}
	row := contend(ctx, ps, spec, r.cfg.cell)
	row.Impl = name
	if row.Leases == 0 {
		return row, fmt.Errorf("no lease was held: %d errors, the first: %s", row.Errors, row.FirstErr)
	}
	return row, nil
}

// span is one lease held, by client proc (unix ns).
type span struct {
	granted, released int64
	weight, proc      int
}

// contentionTally is what a cell's goroutines add up.
type contentionTally struct {
	mu       sync.Mutex
	spans    []span
	ranOut   int64
	errs     int64
	firstErr string
}

// contend runs the cell for d and returns its figures.
func contend(ctx context.Context, ps []weightedPermits, spec contentionSpec, d time.Duration) contentionRow {
	var t contentionTally
	from := time.Now()
	end := from.Add(d)
	var wg sync.WaitGroup
	for proc, p := range ps {
		for range spec.Goroutines {
			wg.Go(func() {
				for time.Now().Before(end) && ctx.Err() == nil {
					t.once(ctx, p, proc, spec.Wait)
				}
			})
		}
	}
	wg.Wait()
	return t.row(spec, from.UnixNano(), end.UnixNano())
}

// once acquires a weight of 1 to 3 within the wait, holds it 5 to 15 ms
// and releases it.
func (t *contentionTally) once(ctx context.Context, p weightedPermits, proc int, wait time.Duration) {
	sp := span{weight: 1 + rand.IntN(3), proc: proc}
	permit, err := p.acquireN(ctx, sp.weight, wait)
	if err != nil || permit == nil {
		t.add(nil, err)
		return
	}
	sp.granted = time.Now().UnixNano()
	time.Sleep(time.Duration(5+rand.IntN(11)) * time.Millisecond)
	sp.released = time.Now().UnixNano()
	err = p.release(context.WithoutCancel(ctx), permit)
	t.add(&sp, err)
}

// add counts a lease held, a wait that ran out (nil, nil) or an error.
func (t *contentionTally) add(sp *span, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case err != nil:
		if t.errs == 0 {
			t.firstErr = err.Error()
		}
		t.errs++
	case sp == nil:
		t.ranOut++
	default:
		t.spans = append(t.spans, *sp)
	}
}

// row computes the cell's figures from its spans, within [from, to].
func (t *contentionTally) row(spec contentionSpec, from, to int64) contentionRow {
	row := contentionRow{Spec: spec, Leases: int64(len(t.spans)), RanOut: t.ranOut, Errors: t.errs, FirstErr: t.firstErr}
	row.Rate = float64(row.Leases) / time.Duration(to-from).Seconds()
	served := make([]int64, spec.Procs)
	for _, sp := range t.spans {
		served[sp.proc]++
	}
	row.Least, row.Most = slices.Min(served), slices.Max(served)
	var area float64
	row.MostHeld, area = sweep(t.spans, from, to)
	row.Share = 100 * area / (float64(spec.N) * float64(to-from))
	row.Fair = float64(row.Least) >= float64(row.Leases)/float64(spec.Procs)/2
	row.Filled = row.Share >= 80
	row.Check = fmt.Sprintf("%d <= %d", row.MostHeld, spec.N)
	if row.MostHeld > spec.N {
		row.Check, row.Violation = fmt.Sprintf("OVER: %d > %d held at once", row.MostHeld, spec.N), true
	}
	return row
}

// sweep returns the most weight held at once (touching spans overlap) and
// the weight held summed over time within [from, to] (weight x ns).
func sweep(spans []span, from, to int64) (int, float64) {
	type event struct {
		at     int64
		weight int
	}
	var evs []event
	for _, sp := range spans {
		evs = append(evs, event{sp.granted, sp.weight}, event{sp.released, -sp.weight})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return b.weight - a.weight // grants first
	})
	held, most, area := 0, 0, 0.0
	for i, e := range evs {
		held += e.weight
		most = max(most, held)
		if i+1 < len(evs) {
			if a, b := max(e.at, from), min(evs[i+1].at, to); b > a {
				area += float64(held) * float64(b-a)
			}
		}
	}
	return most, area
}

// contentionTableMD is the table.
func contentionTableMD(_ config, rows []contentionRow) string {
	return markdownTable("| implementation | wait | leases | leases/s | share of the limit held | least served client | most served client | waits run out | most held at once | errors |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n", rows, func(r contentionRow) string {
		return fmt.Sprintf("| %s | %v | %s | %s | %.1f %% | %s | %s | %s | %s | %s |\n",
			r.Impl, r.Spec.Wait, thousands(r.Leases), rate(r.Rate), r.Share, thousands(r.Least), thousands(r.Most),
			thousands(r.RanOut), r.Check, errorsCell(r.Errors, r.FirstErr))
	})
}

// contentionMethod says how the table is measured.
func contentionMethod(_ config, rows []contentionRow) string {
	spec := rows[0].Spec
	return fmt.Sprintf("The short waits of a middleware (`httplimit.WithInFlight`), from several clients: %d clients, each with a go-redis client and a semaphore of its own "+
		"(a process, as far as Redis and the semaphore can tell; they run in the bench's one process), %d goroutines each; "+
		"each goroutine asks for a weight of 1 to 3 of N = %d, waits at most the cell's wait, holds what it got 5 to 15 ms (`time.Sleep`), releases it, and again, until the cell's time is up. "+
		"\"Share of the limit held\" is the weight held, summed over the cell's time, over N's: each lease counts from its acquisition's return to the call of its release, a lower bound of what the server held; "+
		"the least and most served clients are their leases. "+
		"**leakybucket inflight**: `AcquireWithin(ctx, \"bench\", \"client\", n, wait)`, on the scripting-denied server. "+
		"**Lua semaphore**: the script above, taking n permits (`DECRBY`), within a context of the wait. "+
		"**x/sync/semaphore**: one `semaphore.NewWeighted(N)` for every client, `Acquire(ctx, n)` within a context of the wait.",
		spec.Procs, spec.Goroutines, spec.N)
}
