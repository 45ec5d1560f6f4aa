package main

// The report as a whole: BENCHMARKS.md, and the tables on stdout. Each
// table's part of it is in the file of what the table measures.

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

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

// tables are the markdown tables of what was measured, for stdout.
func tables(cfg config, res results) string {
	var b strings.Builder
	for _, t := range measuredTables(res) {
		fmt.Fprintf(&b, "## %s\n\n%s\n", t.heading, t.markdown(cfg, res))
	}
	if ts := targets(cfg, res); len(ts) > 0 {
		fmt.Fprintf(&b, "## Targets\n\n%s", targetsTableMD(ts))
	}
	return b.String()
}

// document is BENCHMARKS.md.
func document(cfg config, res results, run runInfo) string {
	var b strings.Builder
	header(&b, cfg, run)
	if ts := targets(cfg, res); len(ts) > 0 {
		targetsSection(&b, ts)
	}
	for _, t := range measuredTables(res) {
		t.section(&b, cfg, res)
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

// whereTheTimeGoes explains the tables, quoting their figures; what a run
// did not measure (-impl, -workload, -table) prints as "–".
func whereTheTimeGoes(cfg config, res results) string {
	var b strings.Builder
	for _, t := range measuredTables(res) {
		t.prose(&b, cfg, res)
	}
	return b.String()
}
