// Command bench measures this library against go-redis/redis_rate,
// ulule/limiter, the script-free peers a user picks when Lua is off
// (go-chi/httprate-redis, rolling-rate-limiter's sliding log), a naive
// redislock-based form of its design and the cost of one round trip, and
// writes its tables: throughput on many keys and on a hot key, with the
// CPU a decision costs each side; the steady state at two windows; the
// hammer, the noisy neighbour, an abuser, processes on one key,
// SortedSet's cost by limit, Redis memory per client, the in-process
// limiter, package inflight against a Lua semaphore and
// golang.org/x/sync/semaphore, WithReplicas beside the default on a server
// with a replica, and the targets. From the repository root:
//
//	cd bench && go run .            # the full run, about 10 minutes; writes BENCHMARKS.md and benchmarks.png
//	cd bench && go run . -quick     # a smoke run of about a minute; writes nothing unless -out is given
//
// It needs redis-server (Debian's package, which it installs with apt-get
// when missing), and starts two on free loopback ports with no
// persistence: one whose default user is denied scripting, for this
// library and the script-free peers, and one that allows it, for the Lua
// peers. Both are stopped when the program ends, also on failure or
// Ctrl-C.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

func main() {
	if code, ok := childMode(); ok {
		os.Exit(code)
	}
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

const (
	mdName  = "BENCHMARKS.md"
	pngName = "benchmarks.png"
)

// benchMain is the whole program; it returns the exit code: 0, 1 when a
// check failed or a cell could not run, 2 for bad flags, 130 on interrupt.
func benchMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(stderr, "bench:", err)
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = run(ctx, cfg, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "bench: interrupted; the servers are stopped")
		return 130
	default:
		fmt.Fprintln(stderr, "bench: FAILED:", err)
		return 1
	}
}

// errUsage: the flag package has said what was wrong.
var errUsage = errors.New("usage")

// flags are the command line's.
type flags struct {
	quick                 bool
	cell, timeout, window time.Duration
	impl, workload, table string
	out                   string
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f flags
	fs.BoolVar(&f.quick, "quick", false, "a smoke run of seconds: smaller workloads, 150ms cells, a shorter hammer and neighbour; writes no file unless -out is given")
	fs.DurationVar(&f.cell, "cell", 0, "how long each cell of the throughput and SortedSet tables runs (default 4s, or 150ms with -quick)")
	fs.DurationVar(&f.timeout, "timeout", 10*time.Second, "the longest one call may take")
	fs.DurationVar(&f.window, "window", time.Minute, "the window of the throughput and SortedSet tables' limits; must exceed -cell")
	fs.StringVar(&f.impl, "impl", "", "run only the implementations whose names match this regexp (the ratios need redis_rate and the floor)")
	fs.StringVar(&f.workload, "workload", "", "run only the throughput workloads whose names match this regexp")
	fs.StringVar(&f.table, "table", "", "measure only the tables whose names match this regexp: "+strings.Join(tableNames(), ", "))
	fs.StringVar(&f.out, "out", "", "the folder for "+mdName+" and "+pngName+" (default: this folder, or nowhere with -quick)")
	if err := fs.Parse(args); err != nil {
		return config{}, errUsage
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg, err := f.config()
	if err != nil {
		return config{}, err
	}
	cfg.command = "cd bench && go run ."
	for _, a := range args {
		cfg.command += " " + shellQuote(a)
	}
	return cfg, nil
}

// config turns the flags into what the run measures.
func (f flags) config() (config, error) {
	cfg := config{timeout: f.timeout, window: f.window, limits: throughputLimits, quick: f.quick, out: f.out,
		workloads: fullWorkloads(), cell: 4 * time.Second, hammer: fullHammer, noisy: fullNoisy, costLimits: fullCostLimits,
		abuser: fullAbuser, procs: fullProcs, steady: fullSteady, memory: fullMemory, inflight: fullInflight, contention: fullContention, replicas: fullReplicas}
	if f.quick {
		cfg.workloads, cfg.cell, cfg.hammer, cfg.noisy = quickWorkloads(), 150*time.Millisecond, quickHammer, quickNoisy
		cfg.costLimits, cfg.abuser, cfg.procs, cfg.steady, cfg.memory = quickCostLimits, quickAbuser, quickProcs, quickSteady, quickMemory
		cfg.inflight, cfg.contention, cfg.replicas = quickInflight, quickContention, quickReplicas
	} else if cfg.out == "" {
		cfg.out = "."
	}
	if f.cell > 0 {
		cfg.cell = f.cell
	}
	if cfg.cell >= cfg.window {
		return cfg, fmt.Errorf("-cell %v must be shorter than -window %v, so that a cell's admissions fall in one window", cfg.cell, cfg.window)
	}
	var err error
	var wre *regexp.Regexp
	if cfg.impl, err = compile("-impl", f.impl); err != nil {
		return cfg, err
	}
	if cfg.tables, err = compile("-table", f.table); err != nil {
		return cfg, err
	}
	if wre, err = compile("-workload", f.workload); err != nil {
		return cfg, err
	}
	cfg.workloads = filter(cfg.workloads, func(w workload) bool { return wre.MatchString(w.Name) })
	return cfg, cfg.selectsSomething()
}

func compile(flag, re string) (*regexp.Regexp, error) {
	r, err := regexp.Compile(re)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return r, nil
}

// selectsSomething checks that -impl, -workload and -table leave something
// to measure.
func (cfg config) selectsSomething() error {
	impls := filter(implementations(), func(im impl) bool { return cfg.impl.MatchString(im.name) })
	tables := filter(tableNames(), cfg.tables.MatchString)
	if len(cfg.workloads) == 0 || len(impls) == 0 || len(tables) == 0 {
		return errors.New("-workload, -impl or -table selects nothing")
	}
	return nil
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=./:,+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func filter[T any](xs []T, keep func(T) bool) []T {
	var out []T
	for _, x := range xs {
		if keep(x) {
			out = append(out, x)
		}
	}
	return out
}

func run(ctx context.Context, cfg config, stdout, log io.Writer) error {
	started, load := time.Now(), [2]string{loadAverage()}
	if err := ensureRedis(log); err != nil {
		return err
	}
	lib, err := startServer(ctx, false)
	if err != nil {
		return err
	}
	defer lib.stop()
	peers, err := startServer(ctx, true)
	if err != nil {
		return err
	}
	defer peers.stop()
	fmt.Fprintf(log, "bench: Redis %s on %s for this library, scripting denied (checked); on %s for the peers, scripting allowed\n",
		lib.version, lib.addr, peers.addr)
	r := newRunner(cfg, lib, peers, log)
	defer r.close()
	if err := r.measureIdle(ctx); err != nil {
		return err
	}

	res, err := r.run(ctx)
	if err != nil {
		return err
	}
	if err := noRefusals(ctx, lib); err != nil {
		return err
	}
	run := runInfo{version: lib.version, started: started, wall: time.Since(started), load: load}
	run.load[1] = loadAverage()

	fmt.Fprint(stdout, tables(cfg, res))
	if cfg.out != "" {
		if err := write(cfg, res, run); err != nil {
			return err
		}
		fmt.Fprintf(log, "bench: wrote %s and %s in %s\n", mdName, pngName, cfg.out)
	}
	fmt.Fprintf(log, "bench: done in %s\n", run.wall.Round(time.Second))
	return violations(res)
}

// runInfo is what the report says of the run itself.
type runInfo struct {
	version string // Redis
	started time.Time
	wall    time.Duration
	load    [2]string // at the start and the end
}

// noRefusals checks the ACL log of the scripting-denied server: the
// library must have sent nothing it was refused.
func noRefusals(ctx context.Context, lib *server) error {
	refused, err := lib.refusedCommands(ctx)
	if err != nil {
		return err
	}
	if len(refused) > 0 {
		return fmt.Errorf("the scripting-denied server refused commands: %s", strings.Join(refused, "; "))
	}
	return nil
}

// write writes BENCHMARKS.md and the chart into cfg.out.
func write(cfg config, res results, run runInfo) error {
	// A run of minutes must not be lost to an -out folder not made yet.
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	var png bytes.Buffer
	title := fmt.Sprintf("leakybucket vs redis_rate, ulule/limiter, naive redislock and one round trip; Redis %s, %s", run.version, run.started.UTC().Format("2006-01-02"))
	if len(res.rows) > 0 || len(res.cost) > 0 {
		if err := chart(&png, res, cfg.window, title); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(cfg.out, pngName), png.Bytes(), 0o644); err != nil {
			return err
		}
	}
	doc := document(cfg, res, run)
	return os.WriteFile(filepath.Join(cfg.out, mdName), []byte(doc), 0o644)
}
