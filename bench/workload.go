package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A workload is who calls and how: Keys distinct (resource, client) pairs,
// called round-robin by Goroutines goroutines in each of Procs processes,
// in a database that also holds Unrelated keys that are no limiter's.
type workload struct {
	Name       string
	Resource   string
	Keys       int
	Goroutines int // per process
	Procs      int // 1: in this process; more: child processes of this program
	Unrelated  int
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

// loadResult is what one process measured in one cell.
type loadResult struct {
	Decisions int64
	Errors    int64
	FirstErr  string
	Admitted  []int64 // per key
	Decided   []int64 // per key
	Trips     int64
	Scripts   int64 // script commands sent
	Elapsed   time.Duration
	Latencies []int64 // ns, one per decision
}

// runLoad calls lim from w.Goroutines goroutines, starting at start, and
// issues no new call after d; each call may take up to timeout.
func runLoad(ctx context.Context, w workload, lim limiter, tr *trips, start time.Time, d, timeout time.Duration) loadResult {
	admitted := make([]atomic.Int64, w.Keys)
	decided := make([]atomic.Int64, w.Keys)
	var next, errCount atomic.Int64
	var firstErr atomic.Pointer[string]
	lats := make([][]int64, w.Goroutines)

	time.Sleep(time.Until(start))
	trips0, scripts0 := tr.n.Load(), tr.scripts.Load()
	t0 := time.Now()
	end := t0.Add(d)
	var wg sync.WaitGroup
	for g := range w.Goroutines {
		wg.Go(func() {
			lat := make([]int64, 0, 1024)
			for ctx.Err() == nil && time.Now().Before(end) {
				k := int((next.Add(1) - 1) % int64(w.Keys))
				cctx, cancel := context.WithTimeout(ctx, timeout)
				s := time.Now()
				ok, err := lim.Allow(cctx, w.Resource, w.client(k))
				lat = append(lat, int64(time.Since(s)))
				cancel()
				decided[k].Add(1)
				if ok {
					admitted[k].Add(1)
				}
				if err != nil {
					errCount.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
				}
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	r := loadResult{
		Elapsed:  time.Since(t0),
		Trips:    tr.n.Load() - trips0,
		Scripts:  tr.scripts.Load() - scripts0,
		Errors:   errCount.Load(),
		Admitted: make([]int64, w.Keys),
		Decided:  make([]int64, w.Keys),
	}
	if p := firstErr.Load(); p != nil {
		r.FirstErr = *p
	}
	for i := range w.Keys {
		r.Admitted[i], r.Decided[i] = admitted[i].Load(), decided[i].Load()
		r.Decisions += r.Decided[i]
	}
	for _, l := range lats {
		r.Latencies = append(r.Latencies, l...)
	}
	return r
}

// merge adds what another process measured in the same cell.
func (r *loadResult) merge(o loadResult) {
	r.Decisions += o.Decisions
	r.Errors += o.Errors
	if r.FirstErr == "" {
		r.FirstErr = o.FirstErr
	}
	if r.Admitted == nil {
		r.Admitted, r.Decided = make([]int64, len(o.Admitted)), make([]int64, len(o.Decided))
	}
	for i := range o.Admitted {
		r.Admitted[i] += o.Admitted[i]
		r.Decided[i] += o.Decided[i]
	}
	r.Trips += o.Trips
	r.Scripts += o.Scripts
	r.Elapsed = max(r.Elapsed, o.Elapsed)
	r.Latencies = append(r.Latencies, o.Latencies...)
}

// Child processes. The parent re-executes this program with childEnv set
// to a childSpec; the child connects, builds the limiter, warms its pool
// and prints "ready"; the parent, once every child is ready, writes one
// start instant to all of them; each child starts then, and prints its
// loadResult as JSON.

const childEnv = "LEAKYBUCKET_BENCH_CHILD"

type childSpec struct {
	Addr     string
	User     string
	Password string
	Impl     string
	Limit    int
	Window   time.Duration
	Workload workload
	Duration time.Duration
	Timeout  time.Duration
}

// isChild reports whether this process is a child of the benchmark.
func isChild() bool { return os.Getenv(childEnv) != "" }

// childMain is the whole life of a child process; it returns the exit code.
func childMain() int {
	if err := child(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		return 1
	}
	return 0
}

func child(in io.Reader, out io.Writer) error {
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &spec); err != nil {
		return fmt.Errorf("bad %s: %w", childEnv, err)
	}
	im, err := implByName(spec.Impl)
	if err != nil {
		return err
	}
	rdb := newClient(spec.Addr, spec.User, spec.Password, 2*spec.Workload.Goroutines)
	defer rdb.Close()
	tr := &trips{}
	rdb.AddHook(tr)
	lim, err := im.make(rdb, spec.Limit, spec.Window)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := warmPool(ctx, rdb, spec.Workload.Goroutines); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "go ")), 10, 64)
	if err != nil {
		return fmt.Errorf("bad start line %q", line)
	}
	r := runLoad(ctx, spec.Workload, lim, tr, time.Unix(0, ns), spec.Duration, spec.Timeout)
	return json.NewEncoder(out).Encode(r)
}

// runChildren runs one cell in spec.Workload.Procs child processes with a
// synchronised start, and merges what they measured.
func runChildren(ctx context.Context, spec childSpec) (loadResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return loadResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, spec.Duration+spec.Timeout+time.Minute)
	defer cancel()
	type proc struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var procs []proc
	defer func() {
		for _, p := range procs {
			_ = p.in.Close()
			_ = p.cmd.Process.Kill() // a no-op once it has exited
			_ = p.cmd.Wait()
		}
	}()
	buf, err := json.Marshal(spec)
	if err != nil {
		return loadResult{}, err
	}
	for range spec.Workload.Procs {
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), childEnv+"="+string(buf))
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		in, err := cmd.StdinPipe()
		if err != nil {
			return loadResult{}, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return loadResult{}, err
		}
		if err := cmd.Start(); err != nil {
			return loadResult{}, fmt.Errorf("start child: %w", err)
		}
		procs = append(procs, proc{cmd, in, bufio.NewReaderSize(out, 1<<20)})
	}
	for i, p := range procs {
		line, err := p.out.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "ready" {
			return loadResult{}, fmt.Errorf("child %d not ready: %q, %v", i, line, errors.Join(err, ctx.Err()))
		}
	}
	start := time.Now().Add(20 * time.Millisecond)
	for _, p := range procs {
		if _, err := fmt.Fprintf(p.in, "go %d\n", start.UnixNano()); err != nil {
			return loadResult{}, err
		}
	}
	var total loadResult
	for i, p := range procs {
		var r loadResult
		if err := json.NewDecoder(p.out).Decode(&r); err != nil {
			return loadResult{}, fmt.Errorf("child %d result: %w", i, errors.Join(err, ctx.Err()))
		}
		total.merge(r)
	}
	for i, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			return loadResult{}, fmt.Errorf("child %d: %w", i, err)
		}
	}
	procs = nil
	return total, nil
}
