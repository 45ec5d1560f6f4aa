package main

import (
	"context"
	"fmt"
	"hash/maphash"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket"
	xrate "golang.org/x/time/rate"
)

// The in-process table: NewLocal, with each strategy, against a
// map of x/time/rate limiters and a sharded-mutex fixed-window counter,
// the floor of any in-process limiter, on distinct keys, with every call
// admitted.

// inProcessSpec is the workload of the in-process table.
type inProcessSpec struct {
	Keys, Goroutines int
	Limit            int
	Window           time.Duration
}

var (
	fullInProcess  = inProcessSpec{Keys: 10_000, Goroutines: 8, Limit: 1_000_000, Window: time.Second}
	quickInProcess = inProcessSpec{Keys: 1_000, Goroutines: 4, Limit: 1_000_000, Window: time.Second}
)

// inProcessRow is one implementation's figures.
type inProcessRow struct {
	Impl                string
	Spec                inProcessSpec
	Decisions, Admitted int64
	Rate                float64 // decisions/s
	Allocs              float64 // per decision
	Ours                bool
}

// inProcessLimiter is what the table measures: it returns the decision
// function of one goroutine, which may keep state of its own (NewLocal's
// rows keep the goroutine's Result, as AllowNInto asks).
type inProcessLimiter func() func(key string) bool

// shared is an inProcessLimiter whose goroutines all call decide.
func shared(decide func(key string) bool) inProcessLimiter {
	return func() func(string) bool { return decide }
}

// inProcessImpls are the table's rows, made for spec.
func inProcessImpls(spec inProcessSpec) []struct {
	name string
	ours bool
	make func() (inProcessLimiter, error)
} {
	local := func(s leakybucket.Strategy, into bool) func() (inProcessLimiter, error) {
		return func() (inProcessLimiter, error) {
			b, err := leakybucket.NewLocal(leakybucket.WithStrategy(s), leakybucket.PerClient(leakybucket.Per(spec.Limit, spec.Window)))
			if err != nil {
				return nil, err
			}
			ctx := context.Background()
			if !into {
				return shared(func(key string) bool {
					res, err := b.Allow(ctx, "r", key)
					return err == nil && res.Allowed
				}), nil
			}
			return func() func(string) bool {
				var res leakybucket.Result
				return func(key string) bool {
					return b.AllowNInto(ctx, "r", key, 1, &res) == nil && res.Allowed
				}
			}, nil
		}
	}
	return []struct {
		name string
		ours bool
		make func() (inProcessLimiter, error)
	}{
		{"NewLocal Logs", true, local(leakybucket.Logs, true)},
		{"NewLocal SortedSet", true, local(leakybucket.SortedSet, true)},
		{"NewLocal " + strings.TrimPrefix(windowsName, "leakybucket "), true, local(leakybucket.Windows(windowsPrecision), true)},
		{"NewLocal SortedSet, Allow: a Result each call", false, local(leakybucket.SortedSet, false)},
		{"x/time/rate, a map under a mutex", false, func() (inProcessLimiter, error) { return shared(timeRate(spec)), nil }},
		{"floor: sharded mutex, fixed window", false, func() (inProcessLimiter, error) { return shared(shardedFloor(spec)), nil }},
	}
}

// timeRate is a map of x/time/rate limiters, one per key, as its users
// write it: a token bucket of spec.Limit a window, bursting to it.
func timeRate(spec inProcessSpec) func(key string) bool {
	var mu sync.Mutex
	limiters := map[string]*xrate.Limiter{}
	every := xrate.Every(spec.Window / time.Duration(spec.Limit))
	return func(key string) bool {
		mu.Lock()
		l := limiters[key]
		if l == nil {
			l = xrate.NewLimiter(every, spec.Limit)
			limiters[key] = l
		}
		mu.Unlock()
		return l.Allow()
	}
}

// shardedFloor counts per key in fixed windows, in 256 maps under a mutex
// each: the least work an exact in-process limiter does.
func shardedFloor(spec inProcessSpec) func(key string) bool {
	type counter struct {
		window int64
		n      int
	}
	type shard struct {
		mu   sync.Mutex
		keys map[string]*counter
		_    [40]byte
	}
	shards := make([]shard, 256)
	for i := range shards {
		shards[i].keys = map[string]*counter{}
	}
	seed, start := maphash.MakeSeed(), time.Now()
	return func(key string) bool {
		sh := &shards[maphash.String(seed, key)%256]
		window := int64(time.Since(start) / spec.Window)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		c := sh.keys[key]
		if c == nil {
			c = &counter{}
			sh.keys[key] = c
		}
		if c.window != window {
			c.window, c.n = window, 0
		}
		if c.n >= spec.Limit {
			return false
		}
		c.n++
		return true
	}
}

// inProcessTable is the in-process table: its measurement and its report, below.
var inProcessTable = tableOf("inprocess", "In process", func(res *results) *[]inProcessRow { return &res.inProcess }, report[inProcessRow]{
	measure:  (*runner).inProcessAll,
	markdown: inProcessTableMD, title: "In process", method: inProcessMethod, targets: inProcessTargets,
})

// inProcessAll measures the in-process table.
func (r *runner) inProcessAll(ctx context.Context) ([]inProcessRow, error) {
	var out []inProcessRow
	spec := fullInProcess
	if r.cfg.quick {
		spec = quickInProcess
	}
	for _, im := range inProcessImpls(spec) {
		if !r.cfg.impl.MatchString(im.name) {
			continue
		}
		lim, err := im.make()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", im.name, err)
		}
		row := measureInProcess(ctx, spec, lim, r.cfg.cell)
		row.Impl, row.Ours = im.name, im.ours
		fmt.Fprintf(r.log, "bench: in process %-38s %12s/s  %.2f allocations a decision, %d of %d admitted\n",
			im.name, rate(row.Rate), row.Allocs, row.Admitted, row.Decisions)
		out = append(out, row)
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// measureInProcess calls lim from spec.Goroutines goroutines, each over
// every key in turn from its own start, for d, once the keys' state is in
// its steady state: after one window of the same calls, which fills each
// key's counts with a window of calls (the state grows until then, and
// with it the allocations of its slices).
func measureInProcess(ctx context.Context, spec inProcessSpec, lim inProcessLimiter, d time.Duration) inProcessRow {
	keys := make([]string, spec.Keys)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	flatOut(ctx, spec, lim, keys, spec.Window)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	row := flatOut(ctx, spec, lim, keys, d)
	runtime.ReadMemStats(&after)
	row.Allocs = float64(after.Mallocs-before.Mallocs) / float64(max(row.Decisions, 1))
	return row
}

// flatOut calls lim as measureInProcess says, for d, and returns the
// decisions made and their rate.
func flatOut(ctx context.Context, spec inProcessSpec, lim inProcessLimiter, keys []string, d time.Duration) inProcessRow {
	var stop atomic.Bool
	var decisions, admitted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := range spec.Goroutines {
		wg.Go(func() {
			var n, ok int64
			decide := lim()
			for i := g * len(keys) / spec.Goroutines; !stop.Load(); i++ {
				if decide(keys[i%len(keys)]) {
					ok++
				}
				n++
			}
			decisions.Add(n)
			admitted.Add(ok)
		})
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	stop.Store(true)
	wg.Wait()
	row := inProcessRow{Spec: spec, Decisions: decisions.Load(), Admitted: admitted.Load()}
	row.Rate = float64(row.Decisions) / time.Since(start).Seconds()
	return row
}

// inProcessTableMD is the in-process table.
func inProcessTableMD(_ config, rows []inProcessRow) string {
	var b strings.Builder
	b.WriteString("| implementation | decisions | decisions/s | vs the floor | allocations / decision | admitted |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	floor := 0.0
	for _, r := range rows {
		if strings.HasPrefix(r.Impl, "floor") {
			floor = r.Rate
		}
	}
	for _, r := range rows {
		vs := "–"
		if floor > 0 {
			vs = fmt.Sprintf("%.2fx", r.Rate/floor)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %s |\n", r.Impl, thousands(r.Decisions), rate(r.Rate), vs, r.Allocs, thousands(r.Admitted))
	}
	return b.String()
}

// inProcessMethod says how the in-process table is measured.
func inProcessMethod(_ config, rows []inProcessRow) string {
	s := rows[0].Spec
	return fmt.Sprintf("`NewLocal` keeps the counts in this process's memory, with the same rules and Results as on Redis. "+
		"Each implementation serves %d goroutines calling flat out, each over %d distinct keys in turn, under `PerClient(Per(%d, %v))`, so that every call is admitted; "+
		"the same calls ran for one window before, so that each key's state is full. NewLocal's rows call `AllowNInto` with one `Result` per goroutine, which reuses its slices; "+
		"the row marked Allow makes a new `Result` (its `Rules` slice) each call. Allocations are the process's, counted by the runtime, per decision. "+
		"x/time/rate is a map of `rate.Limiter` under one mutex, as its users write it; the floor is a fixed-window counter per key in 256 maps under a mutex each, the least an exact in-process limiter does.",
		s.Goroutines, s.Keys, s.Limit, s.Window)
}

// inProcessTargets: NewLocal, with every strategy, at least 2 000 000
// decisions/s on distinct keys, with no allocation per admitted decision.
func inProcessTargets(_ config, rows []inProcessRow) []target {
	var out []target
	for _, r := range rows {
		if !r.Ours {
			continue
		}
		where := fmt.Sprintf("in process, %d distinct keys, %d goroutines", r.Spec.Keys, r.Spec.Goroutines)
		out = append(out,
			target{Target: "decisions/s >= 2 000 000", Impl: r.Impl, Where: where, Measured: rate(r.Rate), Met: r.Rate >= 2_000_000},
			target{Target: "0 allocations per admitted decision", Impl: r.Impl, Where: where, Measured: fmt.Sprintf("%.2f", r.Allocs), Met: r.Allocs < 0.005})
	}
	return out
}
