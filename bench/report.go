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
  - **leakybucket** (this library), one row per strategy, on a redis-server whose default user is denied scripting (` + "`ACL SETUSER default -@scripting`" + `, checked with an EVAL that must fail with NOPERM); each rule is ` + "`PerClient(Per(limit, window))`" + ` with the default lock options.
  - **redis_rate** (github.com/go-redis/redis_rate/v10): one EVALSHA per decision, GCRA with burst = rate = limit per window, on a second redis-server of the same version and settings that allows scripting; the naive baseline runs there too. Each server idles while the other's cells run.
  - **ulule/limiter** (github.com/ulule/limiter/v3, its go-redis store): a fixed window, one counter per key raised by INCRBY and set to expire by the window's first call, in one EVALSHA per decision, on the peers' server.
  - **naive**: a github.com/bsm/redislock Lock (Lua obtain and release) around SCAN MATCH of the key's logs and SET PX of a new one, waiting as the library does (4, 8, 16, then 20 ms); [naive.go](naive.go).
  - **floor**: one pipelined SET per decision, admitting everything, on the library's server: what one round trip costs at the same concurrency.
- Workloads: distinct keys are called round-robin; the hot key is one (resource, client); each cell starts on an empty database, checked with DBSIZE.
- Columns: decisions/s is calls answered (admitted or denied) per second over the cell; p50/p99 are the latency of one call; round trips are counted with a go-redis hook (a pipeline or a MULTI/EXEC is one), errors included; "vs" columns divide decisions/s by those of redis_rate and the floor in the same workload and limit.
- Checks: every key's admissions are counted and compared with what the limiter may allow in the time the cell took: the limit for the sliding windows and ulule's fixed window (they are also checked to admit exactly min(calls, limit) when no call failed: "exact"), and burst + rate x elapsed for redis_rate's GCRA, which admits the burst and then refills during the cell. The floor's distinct keys are counted in Redis (DBSIZE). The scripting-denied user's refusals are read from the ACL log after the run.

`)
	b.WriteString("## Results\n\n")
	b.WriteString(table(rows, cfg.window))
	b.WriteString("\n")
	if chart != "" {
		fmt.Fprintf(&b, "![decisions per second, log scale](%s)\n\n", chart)
	}
	return b.String()
}
