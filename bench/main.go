// Command bench measures this library against go-redis/redis_rate, a naive
// redislock-based form of its design, and the cost of one round trip, on a
// Redis server it starts itself (issue 5). From the repository root:
//
//	cd bench && go run .            # the full run, a few minutes; writes BENCHMARKS.md and benchmarks.png
//	cd bench && go run . -quick     # a smoke run of seconds; writes nothing unless -out is given
//
// It needs redis-server (Debian's package, which it installs with apt-get
// when missing), and starts it on a free loopback port with no persistence;
// the server is stopped when the program ends, also on failure or Ctrl-C.
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
	os.Exit(benchMain(os.Args[1:], os.Stdout, os.Stderr))
}

const (
	mdName  = "BENCHMARKS.md"
	pngName = "benchmarks.png"
)

// benchMain is the whole program; it returns the exit code: 0, 1 when a
// check failed or a cell could not run, 2 for bad flags, 130 on interrupt.
func benchMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "a smoke run of a few seconds: smaller workloads and 150ms cells; writes no file unless -out is given")
	cell := fs.Duration("cell", 0, "how long each cell runs (default 4s, or 150ms with -quick)")
	timeout := fs.Duration("timeout", 10*time.Second, "the longest one call may take")
	window := fs.Duration("window", time.Minute, "the window of every limit; must exceed -cell")
	implRE := fs.String("impl", "", "run only the implementations whose names match this regexp (the ratios need redis_rate and the floor)")
	workRE := fs.String("workload", "", "run only the workloads whose names match this regexp")
	out := fs.String("out", "", "the folder for "+mdName+" and "+pngName+" (default: this folder, or nowhere with -quick)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg := config{timeout: *timeout, window: *window, limits: throughputLimits, quick: *quick, out: *out,
		workloads: fullWorkloads(), cell: 4 * time.Second}
	if *quick {
		cfg.workloads, cfg.cell = quickWorkloads(), 150*time.Millisecond
	} else if cfg.out == "" {
		cfg.out = "."
	}
	if *cell > 0 {
		cfg.cell = *cell
	}
	if cfg.cell >= cfg.window {
		fmt.Fprintf(stderr, "bench: -cell %v must be shorter than -window %v, so that a cell's admissions fall in one window\n", cfg.cell, cfg.window)
		return 2
	}
	var err error
	if cfg.impl, err = regexp.Compile(*implRE); err != nil {
		fmt.Fprintln(stderr, "bench: -impl:", err)
		return 2
	}
	wre, err := regexp.Compile(*workRE)
	if err != nil {
		fmt.Fprintln(stderr, "bench: -workload:", err)
		return 2
	}
	cfg.workloads = filter(cfg.workloads, func(w workload) bool { return wre.MatchString(w.Name) })
	if len(cfg.workloads) == 0 || len(filter(implementations(), func(im impl) bool { return cfg.impl.MatchString(im.name) })) == 0 {
		fmt.Fprintln(stderr, "bench: -workload or -impl selects nothing")
		return 2
	}
	cfg.command = "cd bench && go run ."
	for _, a := range args {
		cfg.command += " " + shellQuote(a)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = run(ctx, cfg, stdout, stderr)
	switch {
	case err == nil:
		return 0
	case ctx.Err() != nil:
		fmt.Fprintln(stderr, "bench: interrupted; the server is stopped")
		return 130
	default:
		fmt.Fprintln(stderr, "bench: FAILED:", err)
		return 1
	}
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

	rows, err := r.run(ctx)
	if err != nil {
		return err
	}
	if err := noRefusals(ctx, lib); err != nil {
		return err
	}
	wall := time.Since(started)
	load[1] = loadAverage()

	fmt.Fprintln(stdout, table(rows, cfg.window))
	if cfg.out != "" {
		if err := write(cfg, rows, lib.version, started, wall, load); err != nil {
			return err
		}
		fmt.Fprintf(log, "bench: wrote %s and %s in %s\n", mdName, pngName, cfg.out)
	}
	fmt.Fprintf(log, "bench: %d cells in %s\n", len(rows), wall.Round(time.Second))
	return violations(rows)
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
func write(cfg config, rows []row, version string, started time.Time, wall time.Duration, load [2]string) error {
	var png bytes.Buffer
	title := fmt.Sprintf("leakybucket vs redis_rate, naive redislock and one round trip; Redis %s, %s", version, started.UTC().Format("2006-01-02"))
	if err := chart(&png, rows, cfg.window, title); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.out, pngName), png.Bytes(), 0o644); err != nil {
		return err
	}
	doc := document(cfg, rows, version, started, wall, load, pngName)
	return os.WriteFile(filepath.Join(cfg.out, mdName), []byte(doc), 0o644)
}

// violations is an error naming every cell where a limiter admitted more
// than its limit allows.
func violations(rows []row) error {
	var bad []string
	for _, r := range rows {
		if r.Violation {
			bad = append(bad, fmt.Sprintf("%s, limit %d, %s: %s", r.Workload.Name, r.Limit, r.Impl, r.Check))
		}
	}
	if len(bad) > 0 {
		return errors.New("a limiter admitted more than its limit:\n  " + strings.Join(bad, "\n  "))
	}
	return nil
}
