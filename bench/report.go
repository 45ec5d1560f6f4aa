package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

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

func rate(x float64) string {
	switch {
	case x >= 100:
		return thousands(int64(x + 0.5))
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func admitted(r row) string {
	if r.Bound == 0 {
		return "–"
	}
	return fmt.Sprintf("%s / %s", thousands(r.MaxAdmitted), thousands(r.Bound))
}

func errorsCell(r row) string {
	if r.Errors == 0 {
		return "0"
	}
	msg := r.FirstErr
	if len(msg) > 80 {
		msg = msg[:80] + "…"
	}
	return fmt.Sprintf("%s (%s)", thousands(r.Errors), strings.ReplaceAll(msg, "|", "\\|"))
}

// table is the markdown table of every row.
func table(rows []row, window time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | limit | implementation | decisions | decisions/s | p50 | p99 | round trips / decision | vs redis_rate | vs floor | admitted: most per key / allowed | errors | check |\n")
	fmt.Fprintf(&b, "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d/%s | %s | %s | %s | %v | %v | %.2f | %s | %s | %s | %s | %s |\n",
			r.Workload.Name, r.Limit, shortDur(window), r.Impl, thousands(r.Decisions), rate(r.Rate),
			round(r.P50), round(r.P99), r.Trips, ratio(rows, r, redisRateName), ratio(rows, r, floorName),
			admitted(r), errorsCell(r), r.Check)
	}
	return b.String()
}

// targets states the targets of issue 5 for each strategy of this library,
// with the figures they are judged on.
func targets(rows []row) string {
	var b strings.Builder
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	for _, r := range rows {
		if !strings.HasPrefix(r.Impl, "leakybucket") {
			continue
		}
		w := r.Workload
		rr, okR := find(rows, r, redisRateName)
		switch {
		case w.Keys > 1 && okR:
			x := r.Rate / rr.Rate
			fmt.Fprintf(&b, "- %s, %s, limit %d: distinct keys >= 0.5x redis_rate: %.3fx (%s vs %s decisions/s): %s\n",
				r.Impl, w.Name, r.Limit, x, rate(r.Rate), rate(rr.Rate), verdict(x >= 0.5))
		case w.Keys == 1 && w.Procs == 1 && w.Goroutines > 1 && okR:
			x := r.Rate / rr.Rate
			line := fmt.Sprintf("- %s, %s, limit %d: hot key >= 0.5x redis_rate: %.3fx (%s vs %s decisions/s): %s",
				r.Impl, w.Name, r.Limit, x, rate(r.Rate), rate(rr.Rate), verdict(x >= 0.5))
			if nv, ok := find(rows, r, naiveName); ok {
				y := r.Rate / nv.Rate
				line += fmt.Sprintf("; >= 3x naive redislock: %.3fx (vs %s): %s", y, rate(nv.Rate), verdict(y >= 3))
			}
			b.WriteString(line + "\n")
		case w.Keys == 1 && w.Goroutines == 1 && w.Unrelated == 0:
			fmt.Fprintf(&b, "- %s, %s, limit %d: uncontended round trips <= 2: %.2f: %s\n",
				r.Impl, w.Name, r.Limit, r.Trips, verdict(r.Trips <= 2.0001))
		}
	}
	return b.String()
}

// machine describes where the run happened.
func machine(redisVersion string) string {
	cpu, cores := "unknown CPU", 0
	if buf, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(buf), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				cpu = strings.TrimSpace(v)
			case "processor":
				cores++
			}
		}
	}
	return fmt.Sprintf("%s, %d logical CPUs (/proc/cpuinfo); %s %s/%s, GOMAXPROCS %d; Redis %s on loopback, no persistence",
		cpu, cores, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), redisVersion)
}

// loadAverage is the first three fields of /proc/loadavg: how busy the
// machine was with other work.
func loadAverage() string {
	buf, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(buf))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func windowName(d time.Duration) string {
	switch d {
	case time.Second:
		return "second"
	case time.Minute:
		return "minute"
	case time.Hour:
		return "hour"
	}
	return d.String()
}

// document is BENCHMARKS.md.
func document(cfg config, rows []row, redisVersion string, started time.Time, wall time.Duration, load [2]string, chart string) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by the benchmark program in this folder ([main.go](main.go)), from one run of:\n\n")
	fmt.Fprintf(&b, "```sh\n%s\n```\n\n", cfg.command)
	fmt.Fprintf(&b, "- Run: %s, %s wall time.\n", started.UTC().Format("2006-01-02 15:04 UTC"), wall.Round(time.Second))
	fmt.Fprintf(&b, "- Machine: %s. The benchmark and Redis share the machine; load average (1, 5, 15 min) %s at the start, %s at the end.\n",
		machine(redisVersion), load[0], load[1])
	fmt.Fprintf(&b, "- Each cell runs for %v: no call starts after that, and the calls under way finish (each may take up to %v). Limits are per %s, longer than any cell, so every admission of a cell falls in one window; each cell starts on an emptied database.\n",
		cfg.cell, cfg.timeout, windowName(cfg.window))
	b.WriteString(`- Implementations:
  - **leakybucket** (this library), one row per strategy, as the Redis user ` + "`" + lbUser + "`" + `, which is denied scripting (` + "`-@scripting`" + `); each rule is ` + "`PerClient(Per(limit, window))`" + ` with the default lock options.
  - **redis_rate** (github.com/go-redis/redis_rate/v10): one EVALSHA per decision, GCRA with burst = rate = limit per window, as the default user.
  - **naive**: a github.com/bsm/redislock Lock (Lua obtain and release) around SCAN MATCH of the key's logs and SET PX of a new one, waiting as the library does (4, 8, 16, then 20 ms); [naive.go](naive.go).
  - **floor**: one pipelined SET per decision, admitting everything: what one round trip costs at the same concurrency.
- Workloads: distinct keys are called round-robin; the hot key is one (resource, client); with 4 processes, the program runs 4 copies of itself that start at one instant; the unrelated keys are made with DEBUG POPULATE and counted with DBSIZE before each cell.
- Columns: decisions/s is calls answered (admitted or denied) per second over the cell; p50/p99 are the latency of one call; round trips are counted with a go-redis hook (a pipeline or a MULTI/EXEC is one), errors included; "vs" columns divide decisions/s by those of redis_rate and the floor in the same workload and limit.
- Checks: every key's admissions are counted and compared with what the limiter may allow in the time the cell took: the limit for the sliding windows (they are also checked to admit exactly min(calls, limit) when no call failed: "exact"), and burst + rate x elapsed for redis_rate's GCRA, which admits the burst and then refills during the cell. The floor's distinct keys are counted in Redis (DBSIZE). The scripting-denied user's refusals are read from the ACL log after the run.

`)
	b.WriteString("## Results\n\n")
	b.WriteString(table(rows, cfg.window))
	b.WriteString("\n")
	if chart != "" {
		fmt.Fprintf(&b, "![decisions per second, log scale](%s)\n\n", chart)
	}
	b.WriteString("## The targets of issue 5\n\n")
	b.WriteString(targets(rows))
	b.WriteString("\n## Where the time goes\n\n")
	b.WriteString(whereTheTimeGoes(rows, cfg.window))
	return b.String()
}

// Workload shapes, as the prose below names them.
func isDistinct(w workload) bool { return w.Keys > 1 }
func isHot(w workload) bool      { return w.Keys == 1 && w.Procs == 1 && w.Goroutines > 1 }
func isHotProcs(w workload) bool { return w.Keys == 1 && w.Procs > 1 }
func isAlone(w workload) bool {
	return w.Keys == 1 && w.Procs == 1 && w.Goroutines == 1 && w.Unrelated == 0
}

// figures finds the rows the prose quotes; what a run did not measure
// (-impl, -workload) prints as "–".
type figures struct{ rows []row }

func (f figures) get(shape func(workload) bool, limit int, impl string) (row, bool) {
	for _, r := range f.rows {
		if shape(r.Workload) && r.Limit == limit && r.Impl == impl {
			return r, true
		}
	}
	return row{}, false
}

// all returns the rows of impls that were measured.
func (f figures) all(shape func(workload) bool, limit int, impls ...string) []row {
	var out []row
	for _, im := range impls {
		if r, ok := f.get(shape, limit, im); ok {
			out = append(out, r)
		}
	}
	return out
}

// span formats the smallest and the largest of value over rs: "a–b", or
// one figure when they agree.
func span(rs []row, value func(row) float64, format func(float64) string) string {
	vals := make([]float64, len(rs))
	for i, r := range rs {
		vals[i] = value(r)
	}
	return spanOf(vals, format)
}

func spanOf(vals []float64, format func(float64) string) string {
	if len(vals) == 0 {
		return "–"
	}
	a, b := format(slices.Min(vals)), format(slices.Max(vals))
	if a == b {
		return a
	}
	return a + "–" + b
}

// spanVs is the span of decisions/s over rs divided by those of impl in the
// same workload and limit.
func (f figures) spanVs(rs []row, impl string) string {
	var ratios []float64
	for _, r := range rs {
		if o, ok := find(f.rows, r, impl); ok && o.Rate > 0 {
			ratios = append(ratios, r.Rate/o.Rate)
		}
	}
	if len(ratios) == 0 {
		return "–"
	}
	return spanOf(ratios, func(x float64) string { return fmt.Sprintf("%.2f", x) }) + "x"
}

func decisionsPerS(r row) float64 { return r.Rate }
func tripsOf(r row) float64       { return r.Trips }
func p50Of(r row) float64         { return float64(r.P50) }
func p99Of(r row) float64         { return float64(r.P99) }
func tripsFmt(x float64) string   { return fmt.Sprintf("%.2f", x) }
func latency(x float64) string    { return round(time.Duration(x)).String() }

// whereTheTimeGoes explains the table, quoting its figures.
func whereTheTimeGoes(rows []row, window time.Duration) string {
	f := figures{rows}
	lo, hi := 0, 0
	for _, r := range rows {
		if lo == 0 || r.Limit < lo {
			lo = r.Limit
		}
		hi = max(hi, r.Limit)
	}
	ours := []string{logsName, sortedSetName, windowsName}
	oneRow := func(shape func(workload) bool, limit int, impl string) []row { return f.all(shape, limit, impl) }
	goroutines, procs := 0, 0
	for _, r := range rows {
		if isHot(r.Workload) {
			goroutines = r.Workload.Goroutines
		}
		if isHotProcs(r.Workload) {
			procs = r.Workload.Procs
		}
	}
	fields := int(window / windowsPrecision)
	var b strings.Builder

	// The hot key in one process: coalescing.
	hotLo := f.all(isHot, lo, ours...)
	naive := oneRow(isHot, lo, naiveName)
	fmt.Fprintf(&b, "- **A hot key in one process** is coalesced: concurrent calls that need the same lock (one per (resource, client) here, every rule being per-client) queue behind one leader, which takes the lock and reads the counts in one round trip, decides the queued calls in arrival order, and writes the admitted ones' records in the MULTI/EXEC that frees the lock: one lock, one read and one write per batch of a process (up to 1 024 calls), not per call. "+
		"So round trips per decision fall below one: %s with %d goroutines at limit %d, where redis_rate and the floor pay 1.00 per call. "+
		"At limit %d, once %d calls are admitted every further call is denied and writes nothing, so a batch costs little: %s decisions/s, %s redis_rate (%s), %s the floor, and %s the naive redislock baseline (%s decisions/s, p99 %s), which takes its Lua lock once per call and polls for it.\n",
		span(hotLo, tripsOf, tripsFmt), goroutines, lo,
		lo, lo, span(hotLo, decisionsPerS, rate), f.spanVs(hotLo, redisRateName), span(oneRow(isHot, lo, redisRateName), decisionsPerS, rate),
		f.spanVs(hotLo, floorName), f.spanVs(hotLo, naiveName), span(naive, decisionsPerS, rate), span(naive, p99Of, latency))

	// The same at the high limit: the one read carries the window.
	logged := f.all(isHot, hi, logsName, sortedSetName)
	win := oneRow(isHot, hi, windowsName)
	fmt.Fprintf(&b, "- **A limit of %s on a hot key** makes each batch's one read carry what the window counts: once %s calls are admitted, Logs SCANs %s log keys and SortedSet reads a set of %s members, and each call of the batch is weighed against them. "+
		"Logs and SortedSet fall to %s decisions/s (%s redis_rate, %s the naive baseline) with a p50 of %s; Windows, which reads at most %d fields whatever the limit, stays at %s (%s redis_rate).\n",
		thousands(int64(hi)), thousands(int64(hi)), thousands(int64(hi)), thousands(int64(hi)),
		span(logged, decisionsPerS, rate), f.spanVs(logged, redisRateName), f.spanVs(logged, naiveName), span(logged, p50Of, latency),
		fields, span(win, decisionsPerS, rate), f.spanVs(win, redisRateName))

	// The hot key across processes: one lock in Redis.
	procsLo, procsHi := f.all(isHotProcs, lo, ours...), f.all(isHotProcs, hi, logsName, sortedSetName)
	exact := len(procsLo) > 0
	for _, r := range append(f.all(isHotProcs, lo, ours...), f.all(isHotProcs, hi, ours...)...) {
		exact = exact && r.Errors == 0 && r.MaxAdmitted == int64(r.Limit)
	}
	fmt.Fprintf(&b, "- **A hot key across %d processes** is coalesced per process only: the %d leaders contend for the one Redis lock, and one that finds it taken polls with SET NX at 4, 8, 16, then 20 ms, so the p99 (%s) is that wait. "+
		"At limit %d leakybucket answers %s decisions/s (%s redis_rate); at limit %s, where each holder's batch reads the %s counted calls, Logs and SortedSet answer %s (p99 %s) and Windows %s.",
		procs, procs, span(append(procsLo, procsHi...), p99Of, latency),
		lo, span(procsLo, decisionsPerS, rate), f.spanVs(procsLo, redisRateName), thousands(int64(hi)), thousands(int64(hi)),
		span(procsHi, decisionsPerS, rate), span(procsHi, p99Of, latency), span(oneRow(isHotProcs, hi, windowsName), decisionsPerS, rate))
	if exact {
		b.WriteString(" Every leakybucket cell of this workload admitted exactly the limit, across the processes.")
	}
	b.WriteString(" redis_rate has no lock: each call is one script run by the server, one round trip whatever the contention.\n")

	// Distinct keys: the whole protocol per call.
	dist := f.all(isDistinct, lo, sortedSetName, windowsName)
	dist = append(dist, f.all(isDistinct, hi, sortedSetName, windowsName)...)
	distLogs := append(oneRow(isDistinct, lo, logsName), oneRow(isDistinct, hi, logsName)...)
	fmt.Fprintf(&b, "- **Distinct keys** contend for no lock and coalesce nothing (each key has one caller at a time), so every decision pays the whole protocol: two round trips where redis_rate and the floor pay one, which alone would allow 0.5x the floor, and 10 to 12 commands (UNWATCH, SET NX, WATCH, GET, the read and TIME; then MULTI, the writes, DEL and EXEC) where redis_rate sends one EVALSHA, on a machine whose %d CPUs also run Redis. "+
		"SortedSet and Windows measure %s the floor and %s redis_rate. "+
		"The Logs strategy also pays SCAN pages: every admitted call is a key of the same database, so each decision walks the logs of all the other clients too, and its round trips (%s) grow during the cell as logs pile up (the column shows the mean).\n",
		runtime.NumCPU(), f.spanVs(dist, floorName), f.spanVs(dist, redisRateName), span(distLogs, tripsOf, tripsFmt))

	// What a decision reads: the calls of the window, or the intervals.
	ssLo, ssHi := oneRow(isAlone, lo, sortedSetName), oneRow(isAlone, hi, sortedSetName)
	slower := "–"
	if len(ssLo) == 1 && len(ssHi) == 1 && ssHi[0].Rate > 0 {
		slower = fmt.Sprintf("%.1fx", ssLo[0].Rate/ssHi[0].Rate)
	}
	lgLo, lgHi := oneRow(isAlone, lo, logsName), oneRow(isAlone, hi, logsName)
	morePages := ""
	if len(lgLo) == 1 && len(lgHi) == 1 && lgHi[0].Trips > lgLo[0].Trips+0.005 {
		morePages = fmt.Sprintf(", as the key's %s logs no longer fit one SCAN page of COUNT 1 000", thousands(int64(hi)))
	}
	distSS := append(oneRow(isDistinct, lo, sortedSetName), oneRow(isDistinct, hi, sortedSetName)...)
	fmt.Fprintf(&b, "- **SortedSet reads the whole sorted set** on each decision (ZRANGE key 0 -1 WITHSCORES), and the set keeps every call the window counts (the admitted ones, and the denied ones too with WithRecordDenied): up to the limit on a busy key. So its cost grows with the calls in the window. "+
		"One key, one goroutine, an empty database: %s decisions/s (p50 %s) at limit %d, %s (p50 %s) at limit %s, %s fewer at the same %s round trips. "+
		"Windows reads one hash of at most window / precision fields (%d here) whatever the calls: %s and %s decisions/s. "+
		"Logs reads every counted log too: %s and %s decisions/s, and %s then %s round trips%s. "+
		"With distinct keys each key gets at most %s admissions in a cell, so there the limit changes little (SortedSet: %s decisions/s at limit %d, %s at %s).\n",
		span(ssLo, decisionsPerS, rate), span(ssLo, p50Of, latency), lo, span(ssHi, decisionsPerS, rate), span(ssHi, p50Of, latency), thousands(int64(hi)), slower, span(append(ssLo, ssHi...), tripsOf, tripsFmt),
		fields, span(oneRow(isAlone, lo, windowsName), decisionsPerS, rate), span(oneRow(isAlone, hi, windowsName), decisionsPerS, rate),
		span(lgLo, decisionsPerS, rate), span(lgHi, decisionsPerS, rate), span(lgLo, tripsOf, tripsFmt), span(lgHi, tripsOf, tripsFmt), morePages,
		span(distSS, func(r row) float64 { return float64(r.MaxAdmitted) }, func(x float64) string { return thousands(int64(x)) }),
		span(oneRow(isDistinct, lo, sortedSetName), decisionsPerS, rate), lo, span(oneRow(isDistinct, hi, sortedSetName), decisionsPerS, rate), thousands(int64(hi)))

	b.WriteString("- **Unrelated keys** slow only what SCANs (Logs and the naive baseline): one round trip per 1 000 keys of the database, however few match. SortedSet and Windows read their own keys only.\n")
	return b.String()
}
