package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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

// loadResult is what one load measured.
type loadResult struct {
	Decisions int64
	Errors    int64
	FirstErr  string
	Admitted  []int64 // per key
	Decided   []int64 // per key
	Trips     int64
	Scripts   int64 // script commands sent
	Elapsed   time.Duration
	Latencies []int64    // ns, one per decision
	Spans     []interval // of each admitted call, with load.spans
	Units     int64      // the weight admitted, all keys
	CPU       cpuUse     // with load.cpu
	measured  bool       // CPU is measured (load.cpu was set)
	cpuErr    error      // reading the CPU times failed
}

// An interval is when a call was sent and when its answer came, since the
// load started: the limiter decided it in between. Weight is what it asked.
type interval struct {
	Start, End time.Duration
	Weight     int64
}

// A load is the calls of one cell: w.Goroutines goroutines call w's keys
// round-robin, goroutine g through lims[g*len(lims)/w.Goroutines] (so that
// each limiter has as many), and start no call after d; each call may take
// up to timeout.
type load struct {
	w          workload
	lims       []limiter
	tr         *trips // of the clients the limiters use
	d, timeout time.Duration
	spans      bool // keep the interval of each admitted call
	// weights: the calls ask these weights in turn, each goroutine from
	// its own place in the turn (through AllowN where a weight is not 1);
	// none: weight 1.
	weights []int
	// start, if set, is when the calls begin: the load waits for it (the
	// processes of one load share it). Else at once.
	start time.Time
	// cpu, if set, measures the CPU time the calls take, this process's
	// and the server's.
	cpu *cpuMeter
}

// tally is what the goroutines of a load share.
type tally struct {
	admitted, decided []atomic.Int64 // per key
	next, errs        atomic.Int64
	firstErr          atomic.Pointer[string]
}

func (t *tally) note(k int, ok bool, err error) {
	t.decided[k].Add(1)
	if ok {
		t.admitted[k].Add(1)
	}
	if err != nil {
		t.errs.Add(1)
		msg := err.Error()
		t.firstErr.CompareAndSwap(nil, &msg)
	}
}

// callerResult is what one goroutine measured.
type callerResult struct {
	lat   []int64
	spans []interval
	units int64
}

// allowWithin is one call, bounded by timeout.
func allowWithin(ctx context.Context, lim limiter, timeout time.Duration, resource, client string) (bool, error) {
	return allowNWithin(ctx, lim, timeout, resource, client, 1)
}

// allowNWithin is one call of weight n, bounded by timeout: through Allow
// for weight 1, else through AllowN, which lim must have.
func allowNWithin(ctx context.Context, lim limiter, timeout time.Duration, resource, client string, n int) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if n == 1 {
		return lim.Allow(cctx, resource, client)
	}
	wl, ok := lim.(weightedLimiter)
	if !ok {
		return false, fmt.Errorf("%T has no AllowN", lim)
	}
	return wl.AllowN(cctx, resource, client, n)
}

// run makes the load's calls and returns what they measured.
func (l load) run(ctx context.Context) loadResult {
	t := &tally{admitted: make([]atomic.Int64, l.w.Keys), decided: make([]atomic.Int64, l.w.Keys)}
	per := make([]callerResult, l.w.Goroutines)
	var mark cpuMark
	var cpuErr error
	if l.cpu != nil {
		mark, cpuErr = l.cpu.mark(ctx)
	}
	trips0, scripts0 := l.tr.n.Load(), l.tr.scripts.Load()
	t0 := time.Now()
	if !l.start.IsZero() {
		time.Sleep(time.Until(l.start))
		t0 = l.start
	}
	var wg sync.WaitGroup
	for g := range l.w.Goroutines {
		lim := l.lims[g*len(l.lims)/l.w.Goroutines]
		wg.Go(func() { per[g] = l.call(ctx, lim, t, t0, g) })
	}
	wg.Wait()
	r := loadResult{
		Elapsed: time.Since(t0),
		Trips:   l.tr.n.Load() - trips0,
		Scripts: l.tr.scripts.Load() - scripts0,
		cpuErr:  cpuErr,
	}
	if l.cpu != nil && cpuErr == nil {
		r.CPU, r.cpuErr = l.cpu.since(ctx, mark)
		r.measured = true
	}
	r.collect(t, per)
	return r
}

// call is one goroutine of the load.
func (l load) call(ctx context.Context, lim limiter, t *tally, t0 time.Time, g int) callerResult {
	out := callerResult{lat: make([]int64, 0, 1024)}
	end := t0.Add(l.d)
	for ctx.Err() == nil && time.Now().Before(end) {
		k := int((t.next.Add(1) - 1) % int64(l.w.Keys))
		n := 1
		if len(l.weights) > 0 {
			n = l.weights[(g+len(out.lat))%len(l.weights)]
		}
		s := time.Now()
		ok, err := allowNWithin(ctx, lim, l.timeout, l.w.Resource, l.w.client(k), n)
		e := time.Now()
		out.lat = append(out.lat, int64(e.Sub(s)))
		t.note(k, ok, err)
		if ok {
			out.units += int64(n)
		}
		if ok && l.spans {
			out.spans = append(out.spans, interval{s.Sub(t0), e.Sub(t0), int64(n)})
		}
	}
	return out
}

// collect adds up the tally and the goroutines' figures.
func (r *loadResult) collect(t *tally, per []callerResult) {
	r.Errors = t.errs.Load()
	if p := t.firstErr.Load(); p != nil {
		r.FirstErr = *p
	}
	r.Admitted, r.Decided = make([]int64, len(t.admitted)), make([]int64, len(t.decided))
	for i := range t.admitted {
		r.Admitted[i], r.Decided[i] = t.admitted[i].Load(), t.decided[i].Load()
		r.Decisions += r.Decided[i]
	}
	for _, c := range per {
		r.Latencies = append(r.Latencies, c.lat...)
		r.Spans = append(r.Spans, c.spans...)
		r.Units += c.units
	}
}

// mostWithin is the most weight of the intervals that fit in one span of
// length d: calls both sent and answered within it, so each was decided
// inside it. The best span starts at some call's start, so only those are
// tried.
func mostWithin(spans []interval, d time.Duration) int64 {
	s := slices.Clone(spans)
	slices.SortFunc(s, func(a, b interval) int { return cmp.Compare(a.Start, b.Start) })
	var most int64
	for i := range s {
		end, n := s[i].Start+d, int64(0)
		for j := i; j < len(s) && s[j].Start < end; j++ {
			if s[j].End < end {
				n += s[j].Weight
			}
		}
		most = max(most, n)
	}
	return most
}
