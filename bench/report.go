package main

import (
	"fmt"
	"os"
	"runtime"
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

func errorsCell(n int64, first string) string {
	if n == 0 {
		return "0"
	}
	msg := first
	if len(msg) > 80 {
		msg = msg[:80] + "…"
	}
	return fmt.Sprintf("%s (%s)", thousands(n), strings.ReplaceAll(msg, "|", "\\|"))
}

// table is the markdown table of every row.
func table(rows []row, window time.Duration) string {
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
	return fmt.Sprintf("%s; nproc %d (%d logical CPUs in /proc/cpuinfo); %s %s/%s, GOMAXPROCS %d; Redis %s (two servers) on loopback, no persistence",
		cpu, runtime.NumCPU(), cores, runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), redisVersion)
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

// tables are the markdown tables of what was measured, for stdout.
func tables(cfg config, res results) string {
	var b strings.Builder
	parts := []struct {
		heading string
		present bool
		table   func() string
	}{
		{"Throughput", len(res.rows) > 0, func() string { return table(res.rows, cfg.window) }},
		{"Steady state", len(res.steady) > 0, func() string { return steadyTableMD(res.steady) }},
		{"Hammer", len(res.hammer) > 0, func() string { return hammerTableMD(res.hammer) }},
		{"Noisy neighbour", len(res.noisy) > 0, func() string { return noisyTableMD(res.noisy) }},
		{"Abuser", len(res.abuser) > 0, func() string { return abuserTableMD(res.abuser) }},
		{"Processes", len(res.procs) > 0, func() string { return procsTableMD(res.procs) }},
		{"SortedSet cost", len(res.cost) > 0, func() string { return costTableMD(res.cost, cfg.window) }},
		{"Memory", len(res.memory) > 0, func() string { return memoryTableMD(res.memory) }},
		{"In process", len(res.inProcess) > 0, func() string { return inProcessTableMD(res.inProcess) }},
	}
	for _, p := range parts {
		if p.present {
			fmt.Fprintf(&b, "## %s\n\n%s\n", p.heading, p.table())
		}
	}
	if ts := targets(cfg, res); len(ts) > 0 {
		fmt.Fprintf(&b, "## Targets\n\n%s", targetsTableMD(ts))
	}
	return b.String()
}

// document is BENCHMARKS.md.
func document(cfg config, res results, run runInfo, chart string) string {
	var b strings.Builder
	header(&b, cfg, run)
	if ts := targets(cfg, res); len(ts) > 0 {
		targetsSection(&b, ts)
	}
	sections := []struct {
		present bool
		write   func()
	}{
		{len(res.rows) > 0, func() { throughputSection(&b, cfg, res.rows, chart) }},
		{len(res.steady) > 0, func() { steadySection(&b, res.steady) }},
		{len(res.hammer) > 0, func() { hammerSection(&b, res.hammer) }},
		{len(res.noisy) > 0, func() { noisySection(&b, res.noisy) }},
		{len(res.abuser) > 0, func() { abuserSection(&b, res.abuser) }},
		{len(res.procs) > 0, func() { procsSection(&b, res.procs) }},
		{len(res.cost) > 0, func() { costSection(&b, cfg, res.cost) }},
		{len(res.memory) > 0, func() { memorySection(&b, res.memory) }},
		{len(res.inProcess) > 0, func() { inProcessSection(&b, res.inProcess) }},
	}
	for _, s := range sections {
		if s.present {
			s.write()
		}
	}
	if prose := whereTheTimeGoes(cfg, res); prose != "" {
		fmt.Fprintf(&b, "## Where the time goes\n\n%s", prose)
	}
	return b.String()
}

// header says how the run was made, and where.
func header(b *strings.Builder, cfg config, run runInfo) {
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by the benchmark program in this folder ([main.go](main.go)), from one run of:\n\n")
	fmt.Fprintf(b, "```sh\n%s\n```\n\n", cfg.command)
	fmt.Fprintf(b, "- Run: %s, %s wall time.\n", run.started.UTC().Format("2006-01-02 15:04 UTC"), run.wall.Round(time.Second))
	fmt.Fprintf(b, "- Machine: %s. The benchmark and both servers share the machine, and other work ran on it too: load average (1, 5, 15 min) %s at the start, %s at the end.\n",
		machine(run.version), run.load[0], run.load[1])
	b.WriteString(`- Implementations:
  - **leakybucket** (this library), one row per strategy, on a redis-server whose default user is denied scripting (` + "`ACL SETUSER default -@scripting`" + `, checked with an EVAL that must fail with NOPERM; its ACL log must be empty after the run); each rule is ` + "`PerClient(Per(limit, window))`" + ` with the default lock options.
  - **redis_rate** (github.com/go-redis/redis_rate/v10): one EVALSHA per decision, GCRA with burst = rate = limit per window, on a second redis-server of the same version and settings that allows scripting; the other Lua peers run there too. Each server idles while the other's cells run.
  - **ulule/limiter** (github.com/ulule/limiter/v3, its go-redis store): a fixed window, one counter per key raised by INCRBY and set to expire by the window's first call, in one EVALSHA per decision.
  - **httprate-redis** (github.com/go-chi/httprate-redis v0.6.0, under github.com/go-chi/httprate's RateLimiter, called through its own ` + "`OnLimit`" + ` with a request and a response whose headers it sets): what a user picks instead when Lua is off. An approximate sliding window over fixed windows aligned to the clock: ` + "`MGET`" + ` of the current and previous window's counters, then, for an admitted call, ` + "`MULTI INCRBY EXPIRE EXEC`" + `, under one mutex of the RateLimiter held across both round trips for every key; not exact across processes (a read, then a write). Its fallback to an in-process counter is turned off, so every decision is Redis's. It runs on the library's server, scripting denied. Its bound is the limit per fixed window the span touches; [nolua.go](nolua.go).
  - **rolling-rate-limiter**: the sliding log of the npm library of that name (its RedisRateLimiter), its algorithm written in Go here: one ` + "`MULTI ZREMRANGEBYSCORE ZADD ZRANGE WITHSCORES EXPIRE EXEC`" + ` per call, denied when the set holds more than the limit; a denied call's entry stays, so denied calls count. On the library's server, scripting denied; [nolua.go](nolua.go).
  - **naive**: a github.com/bsm/redislock Lock (Lua obtain and release) around SCAN MATCH of the key's logs and SET PX of a new one, waiting with the library's default lock retry; [naive.go](naive.go).
  - **floor**: one pipelined SET per decision, admitting everything, on the library's server: what one round trip costs at the same concurrency.
- CPU per decision (throughput and steady tables) is each side's CPU time over the cell's decisions: the bench process's (getrusage, user + system) and that of the server the implementation runs on (INFO cpu, used_cpu_user + used_cpu_sys), read just before and after the cell, cells running one at a time, less what each spends idle (measured for a second before the first table). The client's includes the harness's own work per call (a context with a deadline, the clock read twice, a tally), the same for every row.
- Round trips are counted with a go-redis hook (a pipeline or a MULTI/EXEC is one), errors included; the same hook counts script commands, which must be none on the library's server. p50 and p99 are the latency of one call, by nearest rank.

`)
}

// throughputSection is the throughput table, its method and its chart.
func throughputSection(b *strings.Builder, cfg config, rows []row, chart string) {
	b.WriteString("## Throughput\n\n")
	fmt.Fprintf(b, "Each cell runs for %v: no call starts after that, and the calls under way finish (each may take up to %v). Limits are per %s, longer than any cell, so every admission of a cell falls in one window; each cell starts on an empty database (FLUSHDB, then DBSIZE must be 0). ",
		cfg.cell, cfg.timeout, windowName(cfg.window))
	b.WriteString("Distinct keys are called round-robin, so each has one caller at a time; the hot key is one (resource, client) called by every goroutine. Decisions/s is calls answered (admitted or denied) per second over the cell; the \"vs\" columns divide it by redis_rate's and the floor's in the same workload and limit. ")
	b.WriteString("Checks: every key's admissions are compared with what the limiter may allow in the time the cell took: the limit for the sliding windows, ulule's fixed window and rolling-rate-limiter's log (which must also admit exactly min(calls, limit) when no call failed: \"exact\"), the limit per fixed window touched for httprate-redis, and burst + rate x elapsed for redis_rate's GCRA, which refills during the cell. The floor's distinct keys are counted in Redis.\n\n")
	b.WriteString(table(rows, cfg.window))
	b.WriteString("\n")
	if chart != "" {
		fmt.Fprintf(b, "![decisions per second, log scale](%s)\n\n", chart)
	}
}

// hammerTableMD is the hammer table.
func hammerTableMD(rows []hammerRow) string {
	var b strings.Builder
	s := rows[0].Spec
	fmt.Fprintf(&b, "| strategy | callers | limit | decisions/s | p50 | p99 | round trips / decision | admitted | ideal | of the ideal | most in any %v | most in any %v (checked) | errors | check |\n",
		s.Window, s.checkSpan())
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, h := range rows {
		fmt.Fprintf(&b, "| %s | %d Buckets x %d goroutines, %v | %d/%s | %s | %v | %v | %.2f | %d | %d | %.0f%% | %d | %d | %s | %s |\n",
			h.Impl, h.Spec.Buckets, h.Spec.Goroutines, h.Spec.Duration, h.Spec.Limit, shortDur(h.Spec.Window),
			rate(h.Rate), round(h.P50), round(h.P99), h.Trips, h.Admitted, h.Ideal, h.ofIdeal(), h.MostInWindow, h.MostInCheck,
			errorsCell(h.Errors, h.FirstErr), h.Check)
	}
	return b.String()
}

// hammerSection is the hammer table and its method.
func hammerSection(b *strings.Builder, rows []hammerRow) {
	h := rows[0].Spec
	b.WriteString("## Hammer\n\n")
	fmt.Fprintf(b, "%d Buckets of one strategy, each on a client of its own as separate processes would be, call one key with %d goroutines each (%d callers), flat out for %v, under `PerClient(Per(%d, %v))`. ",
		h.Buckets, h.Goroutines, h.Buckets*h.Goroutines, h.Duration, h.Limit, h.Window)
	fmt.Fprintf(b, "The ideal is the most a limiter can admit in %v without ever admitting more than %d in one %v: %d at once in each of the %d windows the run starts, %d. ",
		h.Duration, h.Limit, h.Window, h.Limit, h.ideal()/int64(h.Limit), h.ideal())
	fmt.Fprintf(b, "\"Most in any %v\" counts the admitted calls that were both sent and answered within one span of that length, so each was decided inside it, over every such span. "+
		"The check uses spans of %v: Redis time, which the limiter reads, is kept in whole milliseconds, so two calls decided 999.1 ms apart may carry times 1 000 ms apart and rightly fall in two windows; more than %d in any %v span, or more than %d per started window in all, is an over-admission and fails the run.\n\n",
		h.Window, h.checkSpan(), h.Limit, h.checkSpan(), h.Limit)
	b.WriteString(hammerTableMD(rows))
	b.WriteString("\n")
}

// noisyTableMD is the noisy-neighbour table.
func noisyTableMD(rows []noisyRow) string {
	var b strings.Builder
	b.WriteString("| implementation | noisy client: decisions/s | noisy: admitted / allowed | others: calls | served | of their calls | denied | late | errors | others' p50 | others' p99 | check |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n")
	for _, n := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d / %d | %d | %d | %.1f%% | %d | %d | %s | %v | %v | %s |\n",
			n.Impl, rate(n.NoisyRate), n.NoisyAdmitted, n.NoisyBound, n.Calls, n.Served, n.servedPct(), n.Denied, n.Late,
			errorsCell(n.Errors, n.FirstErr), round(n.P50), round(n.P99), n.Check)
	}
	return b.String()
}

// noisySection is the noisy-neighbour table and its method.
func noisySection(b *strings.Builder, rows []noisyRow) {
	n := rows[0].Spec
	b.WriteString("## Noisy neighbour\n\n")
	fmt.Fprintf(b, "One limiter per implementation, shared by every client of one resource as one service process would share it, under `PerClient(Per(%d, %v))`. "+
		"For %v, one client calls flat out from %d goroutines, far past its limit, while %d other clients call once every %v each (%d calls a second, under the limit), spread over the %v. "+
		"A call of theirs is served if it is admitted, without error, before the client's next call is due (its context's deadline is %v); late calls answered after it, or failed for it (go-redis does not stop a command when its context ends, unless told to). "+
		"The noisy client's admissions, and every other client's, are checked against the limit per started window.\n\n",
		n.Limit, n.Window, n.Duration, n.Noisy, n.Others, n.Pace, int(time.Second/n.Pace), n.Pace, n.Pace)
	b.WriteString(noisyTableMD(rows))
	b.WriteString("\n")
}

// costTableMD is the SortedSet cost table.
func costTableMD(rows []costRow, window time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| limit | calls in the window | decisions | decisions/s | slower than at %s | p50 | p99 | round trips / decision | errors | check |\n",
		thousands(int64(rows[0].Limit)))
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, c := range rows {
		fmt.Fprintf(&b, "| %s/%s | %s | %s | %s | %s | %v | %v | %.2f | %s | %s |\n",
			thousands(int64(c.Limit)), shortDur(window), thousands(c.Members), thousands(c.Decisions), rate(c.Rate), slower(rows[0].Rate, c.Rate),
			round(c.P50), round(c.P99), c.Trips, errorsCell(c.Errors, c.FirstErr), c.Check)
	}
	return b.String()
}

// costSection is the SortedSet cost table and its method.
func costSection(b *strings.Builder, cfg config, rows []costRow) {
	b.WriteString("## SortedSet cost\n\n")
	fmt.Fprintf(b, "What a SortedSet decision costs when its key's window holds as many calls as the limit allows, at limits %s per %s. "+
		"For each limit, one call through the Bucket writes the key's set; the other limit - 1 calls are copies of its member under other ids, with its score, added by ZADD (calling the Bucket a million times would take minutes), and Bucket.Peek must then count exactly the limit. "+
		"One goroutine then calls the key for %v with calls of weight %d: the denial cache answers only calls of weight 1 (a run of them would be answered in this process, at no round trip), so every one of these goes to Redis, one round trip each (checked: at least 0.99 per decision). "+
		"This Bucket has seen the set full, so foresight sends each call to look, as it does every denied call after the first: one MULTI/EXEC that trims the window (ZREMRANGEBYSCORE), counts it (ZCARD), reads its oldest members and its newest (ZRANGE) and renews its expiry, writing no member; the first call that found the set full unseen (not measured here) also adds its members under the cap, which removes them in the same transaction. "+
		"Every call is denied, and the set must still hold the limit at the end. "+
		"Few decisions fit in the cell at the largest limits, so their p50 and p99 rest on few samples (see the decisions column).\n\n",
		costLimitsList(rows), windowName(cfg.window), cfg.cell, costWeight)
	b.WriteString(costTableMD(rows, cfg.window))
	b.WriteString("\n")
}

func costLimitsList(rows []costRow) string {
	var s []string
	for _, c := range rows {
		s = append(s, thousands(int64(c.Limit)))
	}
	return strings.Join(s, ", ")
}

// targetsSection is the target table, first in the document.
func targetsSection(b *strings.Builder, ts []target) {
	b.WriteString("## Targets\n\n")
	b.WriteString("Each target is judged on this run's figures, as ratios between cells of the same run. " +
		"The throughput targets hold at both limits, for Windows and SortedSet; " +
		"\"Logs at most 2 round trips and >= 1.0x on a hot key at 10/min\" is read as both conditions on that one cell. " +
		"The hammer and noisy-neighbour targets hold for every strategy. " +
		"The steady-state rows judge the distinct-keys targets again, on the workload as a running service sees it (see that section): the throughput table's cells start on an empty database, which is kinder. " +
		"The abuser and processes rows hold for every strategy. A miss is a miss: the workloads and targets were set before this code, not tuned to it.\n\n")
	b.WriteString(targetsTableMD(ts))
	b.WriteString("\n")
}

// slower is how many times fewer decisions/s than base rate x is: "96x".
func slower(base, x float64) string {
	if x <= 0 || base <= 0 {
		return "–"
	}
	return rate(base/x) + "x"
}
