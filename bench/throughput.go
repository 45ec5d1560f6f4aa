package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The throughput table: every implementation on each workload and limit,
// one cell each on an empty database; its report, targets and prose.
var throughputTable = tableOf("throughput", "Throughput", func(res *results) *[]row { return &res.rows }, report[row]{
	measure:  (*runner).throughput,
	markdown: throughputTableMD, title: "Throughput", method: throughputMethod, notes: throughputNotes,
	targets: throughputTargets, prose: throughputProse,
	check: func(r row) (string, string, bool) {
		return fmt.Sprintf("%s, limit %d, %s", r.Workload.Name, r.Limit, r.Impl), r.Check, r.Violation
	},
})

// throughput measures every cell of the throughput table, in order.
func (r *runner) throughput(ctx context.Context) ([]row, error) {
	var out []row
	for _, w := range r.cfg.workloads {
		if err := w.checkDistinct(); err != nil {
			return nil, err
		}
		for _, limit := range r.cfg.limits {
			for _, im := range r.impls(all) {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				t0 := time.Now()
				row, err := r.cell(ctx, w, limit, im)
				if err != nil {
					return nil, fmt.Errorf("%s, limit %d, %s: %w", w.Name, limit, im.name, err)
				}
				fmt.Fprintf(r.log, "bench: %-40s %9d/%s  %-33s %10.1f/s  p50 %-9v p99 %-9v %5.2f trips  CPU client %s, Redis %s  %s (%.1fs)\n",
					w.Name, limit, shortDur(r.cfg.window), im.name, row.Rate, round(row.P50), round(row.P99), row.Trips,
					micros(row.ClientCPU), micros(row.ServerCPU), row.Check, time.Since(t0).Seconds())
				out = append(out, row)
			}
		}
	}
	return out, nil
}

// cell measures one implementation on one workload and limit, on an empty
// database.
func (r *runner) cell(ctx context.Context, w workload, limit int, im impl) (row, error) {
	s := r.sideOf(im)
	lim, err := prepare(ctx, s, im, limit, r.cfg.window, w.Goroutines)
	if err != nil {
		return row{}, err
	}
	res := load{w: w, lims: []limiter{lim}, tr: s.trips, d: r.cfg.cell, timeout: r.cfg.timeout, cpu: &s.meter}.run(ctx)
	if err := ctx.Err(); err != nil {
		return row{}, err
	}
	if err := checkSent(im, res); err != nil {
		return row{}, err
	}
	out := summarise(w, limit, im, r.cfg.window, res)
	if im.bound == nil {
		out.Check, err = checkFloor(ctx, s, res)
	}
	return out, err
}

// checkFloor checks that the floor wrote one key per distinct key it was
// given: that the workload's keys are distinct in Redis too.
func checkFloor(ctx context.Context, s *side, res loadResult) (string, error) {
	n, err := s.admin.DBSize(ctx).Result()
	if err != nil {
		return "", err
	}
	touched := int64(0)
	for _, d := range res.Decided {
		if d > 0 {
			touched++
		}
	}
	if n != touched {
		return "", fmt.Errorf("the floor called %d distinct keys, but the database holds %d keys: keys collide", touched, n)
	}
	return fmt.Sprintf("%d distinct keys written", touched), nil
}

// summarise computes a row and checks the admissions against the limit.
func summarise(w workload, limit int, im impl, window time.Duration, res loadResult) row {
	out := row{Workload: w, Limit: limit, Impl: im.name, measures: measure(res)}
	for _, a := range res.Admitted {
		out.MaxAdmitted = max(out.MaxAdmitted, a)
		out.TotalAdmitted += a
	}
	if im.bound != nil {
		out.Bound = im.bound(limit, window, res.Elapsed)
		out.checkAdmissions(im, window, res)
	}
	return out
}

// checkAdmissions compares each key's admissions with the bound, and for
// an exact limiter within one window with min(calls, limit).
func (out *row) checkAdmissions(im impl, window time.Duration, res loadResult) {
	w, exact := out.Workload, im.exact && res.Elapsed < window
	var over, under []string
	for k, a := range res.Admitted {
		if a > out.Bound {
			over = append(over, fmt.Sprintf("%s/%s admitted %d > %d", w.Resource, w.client(k), a, out.Bound))
		}
		if want := min(res.Decided[k], int64(out.Limit)); exact && a < want {
			under = append(under, fmt.Sprintf("%s/%s admitted %d of the %d it asked within the limit", w.Resource, w.client(k), a, want))
		}
	}
	switch {
	case len(over) > 0:
		out.Check, out.Violation = im.overAdmitted(fmt.Sprintf("at %d keys, e.g. %s", len(over), over[0]))
	case len(under) > 0:
		out.Check = fmt.Sprintf("ok, but under-admitted at %d keys, e.g. %s", len(under), under[0])
	case exact:
		out.Check = "ok, exact"
	default:
		out.Check = "ok"
	}
}

// throughputTableMD is the markdown table of every row.
func throughputTableMD(cfg config, rows []row) string {
	window := cfg.window
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | limit | implementation | decisions | decisions/s | p50 | p99 | round trips / decision | client CPU / decision | Redis CPU / decision | vs redis_rate | vs floor | admitted: most per key / allowed | errors | check |\n")
	fmt.Fprintf(&b, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s/%s | %s | %s | %s | %v | %v | %.2f | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Workload.Name, thousands(int64(r.Limit)), shortDur(window), r.Impl, thousands(r.Decisions), rate(r.Rate),
			round(r.P50), round(r.P99), r.Trips, micros(r.ClientCPU), micros(r.ServerCPU), ratio(rows, r, redisRateName), ratio(rows, r, floorName),
			admitted(r), errorsCell(r.Errors, r.FirstErr), r.Check)
	}
	return b.String()
}

// throughputMethod says how the cells run and how they are checked.
func throughputMethod(cfg config, _ []row) string {
	return fmt.Sprintf("Each cell runs for %v: no call starts after that, and the calls under way finish (each may take up to %v). Limits are per %s, longer than any cell, so every admission of a cell falls in one window; each cell starts on an empty database (FLUSHDB, then DBSIZE must be 0). ",
		cfg.cell, cfg.timeout, windowName(cfg.window)) +
		"Distinct keys are called round-robin, so each has one caller at a time; the hot key is one (resource, client) called by every goroutine. Decisions/s is calls answered (admitted or denied) per second over the cell; the \"vs\" columns divide it by redis_rate's and the floor's in the same workload and limit. " +
		"Checks: every key's admissions are compared with what the limiter may allow in the time the cell took: the limit for the sliding windows, ulule's fixed window and rolling-rate-limiter's log (which must also admit exactly min(calls, limit) when no call failed: \"exact\"), the limit per fixed window touched for httprate-redis, and burst + rate x elapsed for redis_rate's GCRA, which refills during the cell. The floor's distinct keys are counted in Redis."
}

// throughputNotes show the chart.
func throughputNotes(config, []row) string {
	return fmt.Sprintf("![decisions per second, log scale](%s)\n\n", pngName)
}

// throughputTargets judges the targets of each workload at each limit.
func throughputTargets(cfg config, rows []row) []target {
	var out []target
	for _, w := range cfg.workloads {
		for _, limit := range cfg.limits {
			out = append(out, cellTargets(rows, w, limit, limit == cfg.limits[0])...)
		}
	}
	return out
}

// cellTargets: on distinct keys Windows >= 1.2x redis_rate and
// SortedSet >= 1.0x; on a hot key both >= 1.0x; their p99 at most 1.5x
// redis_rate's; on a hot key at the lowest limit, Logs >= 1.0x with at
// most 2 round trips per decision; and GCRA's own (gcraTargets).
func cellTargets(rows []row, w workload, limit int, lowest bool) []target {
	rr, ok := findCell(rows, w, limit, redisRateName)
	if !ok {
		return nil
	}
	where := fmt.Sprintf("%s, %s/min", w.Name, thousands(int64(limit)))
	speedups := []speedup{{windowsName, 1.0}, {sortedSetName, 1.0}}
	if w.Keys > 1 {
		speedups[0].min = 1.2
	}
	var out []target
	for _, s := range speedups {
		if r, ok := findCell(rows, w, limit, s.impl); ok {
			out = append(out, rateTarget(r, rr, s.min, where), p99Target(r, rr, where))
		}
	}
	if r, ok := findCell(rows, w, limit, logsName); ok && w.Keys == 1 && lowest {
		out = append(out, rateTarget(r, rr, 1.0, where), tripsTarget(r, where))
	}
	if r, ok := findCell(rows, w, limit, gcraName); ok {
		out = append(out, gcraTargets(r, rr, w, where)...)
	}
	return out
}

// gcraTargets are the leaky bucket's, as its issue set them: at least
// 0.8x redis_rate on distinct keys (two round trips against one EVALSHA)
// and 1.0x on a hot key (batched), p99 at most 2x, Redis CPU per decision
// at most redis_rate's, and on distinct keys, where a call has its key to
// itself, 2 round trips per decision.
func gcraTargets(r, rr row, w workload, where string) []target {
	least := 1.0
	if w.Keys > 1 {
		least = 0.8
	}
	out := []target{rateTarget(r, rr, least, where), p99Target(r, rr, where), serverCPUTarget(r, rr, 1.0, where)}
	if w.Keys > 1 {
		out = append(out, tripsTarget(r, where))
	}
	return out
}

// tripsTarget is at most 2 round trips per decision.
func tripsTarget(r row, where string) target {
	return target{
		Target: "round trips per decision <= 2", Impl: r.Impl, Where: where,
		Measured: fmt.Sprintf("%.2f", r.Trips), Met: r.Trips <= 2.0001,
	}
}

// throughputProse says where the time goes on distinct keys and on a hot
// key.
func throughputProse(b *strings.Builder, cfg config, rows []row) {
	distinctProse(b, rows)
	hotProse(b, cfg, rows)
}

func distinctProse(b *strings.Builder, rows []row) {
	ours := cells(rows, distinct, sortedSetName, windowsName)
	logs := cells(rows, distinct, logsName)
	fmt.Fprintf(b, "- **Distinct keys** (distinct clients of one resource): SortedSet and Windows decide the concurrent calls of a resource in one MULTI/EXEC per batch, one batch of a line at a time, the clients split between two lines as every rule here is per-client, so a decision costs %s round trips; but each call brings its own set or hash, so a batch's transaction grows with its calls. Windows also reads each client's totals (HGET) when the call is far from its limits, and its whole hash (HGETALL) when it is not, marks each transaction (a SET of a short-lived key, so that a lost reply can be resolved) and reads the generation, and each of its denied calls must be taken back (by the next batch's transaction): its calls cost Redis more than the floor's SET, which is why neither strategy reaches the floor here. "+
		"SortedSet and Windows answer %s decisions/s, %s redis_rate (%s) and %s the floor (%s); ulule/limiter answers %s. "+
		"Logs takes its lock per client and walks the database with SCAN, where every batch of every client is a key: %s round trips and %s decisions/s.\n",
		spanRows(ours, tripsOf, tripsFmt), spanRows(ours, rateOf, rate), spanVs(rows, ours, redisRateName),
		spanRows(cells(rows, distinct, redisRateName), rateOf, rate), spanVs(rows, ours, floorName),
		spanRows(cells(rows, distinct, floorName), rateOf, rate), spanRows(cells(rows, distinct, ululeName), rateOf, rate),
		spanRows(logs, tripsOf, tripsFmt), spanRows(logs, rateOf, rate))
}

func hotProse(b *strings.Builder, cfg config, rows []row) {
	lo, hi := cfg.limits[0], cfg.limits[len(cfg.limits)-1]
	ours := []string{logsName, sortedSetName, windowsName}
	atLo := cells(rows, at(hot, lo), ours...)
	logged := cells(rows, at(hot, hi), logsName, sortedSetName)
	win := cells(rows, at(hot, hi), windowsName)
	fmt.Fprintf(b, "- **A hot key** is batched: the concurrent calls of one Bucket for one resource are decided together, in one MULTI/EXEC (SortedSet, Windows) or under one lock (Logs), so a decision costs %s round trips. "+
		"At %s/min the limit is soon reached and every later call is denied: the strategies answer %s decisions/s, %s redis_rate. "+
		"At %s/min every call is admitted and recorded: Logs SCANs every log key in the window and SortedSet adds to a sorted set of the window's calls (O(log n)), %s decisions/s (%s redis_rate, p99 %s), while Windows adds to one hash of at most window / precision fields: %s (%s redis_rate, p99 %s).\n",
		spanRows(cells(rows, hot, ours...), tripsOf, tripsFmt),
		thousands(int64(lo)), spanRows(atLo, rateOf, rate), spanVs(rows, atLo, redisRateName),
		thousands(int64(hi)), spanRows(logged, rateOf, rate), spanVs(rows, logged, redisRateName), spanRows(logged, p99Of, latency),
		spanRows(win, rateOf, rate), spanVs(rows, win, redisRateName), spanRows(win, p99Of, latency))
}

// The limits of the throughput table, per window (a minute): one a decision
// reads little for, and one no workload reaches in a cell, so that every
// call is admitted and a decision reads all the window has counted.
var throughputLimits = []int{10, 1_000_000}

// fullWorkloads are the targets': many keys with one caller each, and one
// key with many callers.
func fullWorkloads() []workload {
	return []workload{
		{Name: "10 000 distinct keys, 32 goroutines", Resource: "distinct", Keys: 10_000, Goroutines: 32},
		{Name: "hot key, 64 goroutines", Resource: "hot", Keys: 1, Goroutines: 64},
	}
}

// quickWorkloads have the shapes of the full ones, smaller.
func quickWorkloads() []workload {
	return []workload{
		{Name: "1 000 distinct keys, 8 goroutines", Resource: "distinct", Keys: 1_000, Goroutines: 8},
		{Name: "hot key, 16 goroutines", Resource: "hot", Keys: 1, Goroutines: 16},
	}
}

// row is one cell: a workload, a limit, an implementation.
type row struct {
	Workload workload
	Limit    int
	Impl     string
	measures

	MaxAdmitted   int64 // the most any key got
	Bound         int64 // the most any key may get; 0 for the floor
	TotalAdmitted int64
	Check         string // what the verification found
	Violation     bool   // a key got more than the limit allows
}

// find returns the row of impl in the same workload and limit as r.
func find(rows []row, r row, impl string) (row, bool) {
	for _, o := range rows {
		if o.Workload.Name == r.Workload.Name && o.Limit == r.Limit && o.Impl == impl {
			return o, true
		}
	}
	return row{}, false
}

func ratio(rows []row, r row, impl string) string {
	o, ok := find(rows, r, impl)
	if !ok || o.Rate == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2fx", r.Rate/o.Rate)
}

func admitted(r row) string {
	if r.Bound == 0 {
		return "–"
	}
	return fmt.Sprintf("%s / %s", thousands(r.MaxAdmitted), thousands(r.Bound))
}

// cells are the rows of impls (all, if none is named) that keep keeps.
func cells(rows []row, keep func(row) bool, impls ...string) []row {
	return filter(rows, func(r row) bool { return keep(r) && (len(impls) == 0 || slices.Contains(impls, r.Impl)) })
}

func distinct(r row) bool { return r.Workload.Keys > 1 }

func hot(r row) bool { return r.Workload.Keys == 1 }

// at keeps the rows of one shape at one limit.
func at(shape func(row) bool, limit int) func(row) bool {
	return func(r row) bool { return shape(r) && r.Limit == limit }
}

func spanRows(rs []row, value func(row) float64, format func(float64) string) string {
	vals := make([]float64, len(rs))
	for i, r := range rs {
		vals[i] = value(r)
	}
	return spanOf(vals, format)
}

// spanVs is the span of decisions/s over rs divided by impl's in the same
// cells of all.
func spanVs(all, rs []row, impl string) string {
	var ratios []float64
	for _, r := range rs {
		if o, ok := find(all, r, impl); ok && o.Rate > 0 {
			ratios = append(ratios, r.Rate/o.Rate)
		}
	}
	return spanOf(ratios, func(x float64) string { return fmt.Sprintf("%.2f", x) }) + "x"
}

func rateOf(r row) float64 { return r.Rate }

func tripsOf(r row) float64 { return r.Trips }

func p99Of(r row) float64 { return float64(r.P99) }

func tripsFmt(x float64) string { return fmt.Sprintf("%.2f", x) }

// speedup is one target on decisions/s against redis_rate.
type speedup struct {
	impl string
	min  float64
}

func findCell(rows []row, w workload, limit int, impl string) (row, bool) {
	for _, r := range rows {
		if r.Workload.Name == w.Name && r.Limit == limit && r.Impl == impl {
			return r, true
		}
	}
	return row{}, false
}
