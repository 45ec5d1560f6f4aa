package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// The processes table: Procs processes of this program,
// each with a Bucket on a go-redis client of its own, call one key from
// Goroutines goroutines each, weights 1 to 3 in turn, flat out for
// Duration, under PerClient(Per(Limit, Window)).
type procsSpec struct {
	Procs, Goroutines, Limit int
	Window, Duration         time.Duration
}

var (
	fullProcs  = procsSpec{Procs: 4, Goroutines: 100, Limit: 100, Window: 2 * time.Second, Duration: 8 * time.Second}
	quickProcs = procsSpec{Procs: 4, Goroutines: 16, Limit: 100, Window: 2 * time.Second, Duration: 2 * time.Second}
)

// mostPossible is the most weight a limiter can admit in Duration without
// ever admitting more than Limit in one Window: Limit in each disjoint
// window that fits in the run.
func (p procsSpec) mostPossible() int64 {
	return int64(p.Limit) * int64(p.Duration/p.Window)
}

// checkSpan is the span in which at most Limit may be decided: the window
// less the millisecond that Redis time is rounded down to (as the
// hammer's).
func (p procsSpec) checkSpan() time.Duration { return p.Window - time.Millisecond }

// procsRow is one implementation's processes.
type procsRow struct {
	Impl string
	Spec procsSpec
	measures
	Units                     int64 // admitted weight
	MostInWindow, MostInCheck int64 // admitted weight within one span
	Check                     string
	Violation                 bool
	Ours                      bool
}

// ofMost is the weight admitted as a share of the most possible, in %.
func (p procsRow) ofMost() float64 { return 100 * float64(p.Units) / float64(p.Spec.mostPossible()) }

// childEnv names the variable that makes this program one process of the
// table: it holds the childJob, in JSON.
const childEnv = "LEAKYBUCKET_BENCH_CHILD"

// childJob is what one process is asked to do.
type childJob struct {
	Impl, Addr string
	Spec       procsSpec
	Start      time.Time // when the calls begin, the same for every process
	Timeout    time.Duration
}

// childReport is what one process measured.
type childReport struct {
	Decisions, Trips, Scripts, Errors, Units int64
	FirstErr                                 string
	Elapsed                                  time.Duration
	Latencies                                []int64
	Spans                                    []interval
}

// childMode runs this program as one process of the table, if asked to;
// it reports whether it was.
func childMode() (int, bool) {
	spec, ok := os.LookupEnv(childEnv)
	if !ok {
		return 0, false
	}
	if err := runChild(context.Background(), spec, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		return 1, true
	}
	return 0, true
}

// runChild makes the job's calls and writes its report to out.
func runChild(ctx context.Context, spec string, out io.Writer) error {
	var job childJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		return err
	}
	ims := filter(implementations(), func(im impl) bool { return im.name == job.Impl })
	if len(ims) != 1 {
		return fmt.Errorf("no implementation %q", job.Impl)
	}
	srv := &server{addr: job.Addr}
	s := &side{srv: srv, trips: &trips{}}
	s.client = s.more()
	defer s.client.Close()
	lim, err := ims[0].make(s.client, job.Spec.Limit, job.Spec.Window)
	if err != nil {
		return err
	}
	if err := warmPool(ctx, s.client, job.Spec.Goroutines); err != nil {
		return err
	}
	if _, err := lim.Allow(ctx, "warmup", "warmup"); err != nil {
		return fmt.Errorf("warm-up call: %w", err)
	}
	if time.Now().After(job.Start) {
		return fmt.Errorf("ready %v after the start", time.Since(job.Start))
	}
	w := workload{Name: "processes", Resource: "procs", Keys: 1, Goroutines: job.Spec.Goroutines}
	got := load{w: w, lims: []limiter{lim}, tr: s.trips, d: job.Spec.Duration, timeout: job.Timeout,
		spans: true, weights: []int{1, 2, 3}, start: job.Start}.run(ctx)
	return json.NewEncoder(out).Encode(childReport{Decisions: got.Decisions, Trips: got.Trips, Scripts: got.Scripts,
		Errors: got.Errors, Units: got.Units, FirstErr: got.FirstErr, Elapsed: got.Elapsed, Latencies: got.Latencies, Spans: got.Spans})
}

// procsImpls are the implementations of the table: this library's
// strategies and the peers with AllowN (their one rule is the table's),
// among them httprate-redis, whose read then write is where processes
// part from one another.
func procsImpls() []impl {
	return filter(implementations(), func(im impl) bool {
		return im.ours || im.name == redisRateName || im.name == ululeName || im.name == httprateName
	})
}

// procsTable is the processes table: its measurement and its report, below.
var procsTable = tableOf("processes", "Processes", func(res *results) *[]procsRow { return &res.procs }, report[procsRow]{
	measure:  each(procsImpls, (*runner).procs, procsLog),
	markdown: procsTableMD, title: "Processes on one key", method: procsMethod, targets: procsTargets,
	checked: "processes", check: func(r procsRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// procs starts the processes on an empty database, waits for their
// reports and sums them up.
func (r *runner) procs(ctx context.Context, im impl) (procsRow, error) {
	spec, s := r.cfg.procs, r.sideOf(im)
	if err := s.empty(ctx); err != nil {
		return procsRow{}, err
	}
	exe, err := os.Executable()
	if err != nil {
		return procsRow{}, err
	}
	job := childJob{Impl: im.name, Addr: s.srv.addr, Spec: spec, Start: time.Now().Add(3 * time.Second), Timeout: r.cfg.timeout}
	buf, err := json.Marshal(job)
	if err != nil {
		return procsRow{}, err
	}
	reports := make([]childReport, spec.Procs)
	errs := make([]error, spec.Procs)
	var wg sync.WaitGroup
	for i := range spec.Procs {
		wg.Go(func() { reports[i], errs[i] = runProcess(ctx, exe, string(buf)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return procsRow{}, err
	}
	return summariseProcs(im, spec, reports)
}

// procsLog is the line the run logs of a row.
func procsLog(p procsRow) string {
	return fmt.Sprintf("processes %-33s admitted %d of the most possible %d (%.1f%%), at most %d in %v, %d in %v; %.3f trips; %s",
		p.Impl, p.Units, p.Spec.mostPossible(), p.ofMost(), p.MostInWindow, p.Spec.Window, p.MostInCheck, p.Spec.checkSpan(), p.Trips, p.Check)
}

// runProcess runs one process of the table and reads its report.
func runProcess(ctx context.Context, exe, job string) (childReport, error) {
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+job)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return childReport{}, fmt.Errorf("a process: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var rep childReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return childReport{}, fmt.Errorf("a process's report: %w", err)
	}
	return rep, nil
}

// summariseProcs adds up the processes' reports and checks the
// admissions: never more than the limit per started window in all, nor,
// for this library's sliding windows, in any one window (a fixed window or
// a GCRA may admit up to twice its limit across a boundary).
func summariseProcs(im impl, spec procsSpec, reports []childReport) (procsRow, error) {
	var all loadResult
	for _, rep := range reports {
		all.Decisions, all.Trips, all.Scripts, all.Units = all.Decisions+rep.Decisions, all.Trips+rep.Trips, all.Scripts+rep.Scripts, all.Units+rep.Units
		all.Errors += rep.Errors
		if all.FirstErr == "" {
			all.FirstErr = rep.FirstErr
		}
		all.Elapsed = max(all.Elapsed, rep.Elapsed)
		all.Latencies = append(all.Latencies, rep.Latencies...)
		all.Spans = append(all.Spans, rep.Spans...)
	}
	if err := checkSent(im, all); err != nil {
		return procsRow{}, err
	}
	out := procsRow{Impl: im.name, Spec: spec, measures: measure(all), Units: all.Units, Ours: im.ours,
		MostInWindow: mostWithin(all.Spans, spec.Window), MostInCheck: mostWithin(all.Spans, spec.checkSpan())}
	out.Check = "ok"
	if bound := im.bound(spec.Limit, spec.Window, all.Elapsed); out.Units > bound {
		out.Check, out.Violation = im.overAdmitted(fmt.Sprintf("%d in %v, more than %d", out.Units, all.Elapsed.Round(time.Millisecond), bound))
	} else if im.ours && out.MostInCheck > im.bound(spec.Limit, spec.Window, spec.checkSpan()) {
		out.Violation, out.Check = true, fmt.Sprintf("OVER-ADMITTED: %d sent and answered within %v", out.MostInCheck, spec.checkSpan())
	}
	return out, nil
}

// procsTableMD is the processes table.
func procsTableMD(_ config, rows []procsRow) string {
	s := rows[0].Spec
	return markdownTable(fmt.Sprintf("| implementation | callers | decisions/s | p50 | p99 | round trips / decision | admitted (weight) | of the most possible | most in any %v | most in any %v (checked) | errors | check |\n", s.Window, s.checkSpan())+
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n", rows, func(p procsRow) string {
		return fmt.Sprintf("| %s | %d processes x %d goroutines, %v | %s | %v | %v | %.3f | %d | %.1f%% | %d | %d | %s | %s |\n",
			p.Impl, p.Spec.Procs, p.Spec.Goroutines, p.Spec.Duration, rate(p.Rate), round(p.P50), round(p.P99), p.Trips,
			p.Units, p.ofMost(), p.MostInWindow, p.MostInCheck, errorsCell(p.Errors, p.FirstErr), p.Check)
	})
}

func procsMethod(_ config, rows []procsRow) string {
	p := rows[0].Spec
	return fmt.Sprintf("%d OS processes (this program, started %d times by the benchmark with the job in an environment variable), each with one limiter on a go-redis client of its own, call one key from %d goroutines each, weights 1, 2, 3 in turn, flat out for %v from one start time, under `PerClient(Per(%d, %v))` (redis_rate: burst = rate = %d per %v; ulule/limiter: its fixed window), on an empty database. "+
		"The most possible is %d per disjoint %v window in the %v: %d (calls under way at the end are answered after it, so a share can pass 100%%). \"Most in any\" counts the weight of the admitted calls whose whole span from call to reply lies in one span of that length, over every such span (the processes share the machine's clock); as in the hammer, the check uses %v, Redis time being whole milliseconds. "+
		"GCRA and a fixed window may admit up to twice their limit across a boundary, and so may httprate-redis's estimate over fixed windows of the clock (whose read, then write, also lets two processes take the same last room), so only this library's sliding windows are checked per span, and the others' share may pass 100%%: each is checked against its own bound in all.",
		p.Procs, p.Procs, p.Goroutines, p.Duration, p.Limit, p.Window, p.Limit, p.Window, p.Limit, p.Window, p.Duration, p.mostPossible(), p.checkSpan())
}

// procsTargets: processes on one key admit >= 90% of the most
// possible, and never more than the limit in a window.
func procsTargets(_ config, rows []procsRow) []target {
	var out []target
	for _, p := range rows {
		if !p.Ours {
			continue
		}
		where := fmt.Sprintf("%d processes x %d goroutines, one key, weights 1-3, %d/%s, %v", p.Spec.Procs, p.Spec.Goroutines, p.Spec.Limit, shortDur(p.Spec.Window), p.Spec.Duration)
		out = append(out, target{
			Target: "admitted >= 90% of the most possible", Impl: p.Impl, Where: where,
			Measured: fmt.Sprintf("%.1f%% (%d of %d)", p.ofMost(), p.Units, p.Spec.mostPossible()), Met: p.ofMost() >= 90,
		}, target{
			Target: spanTarget(p.Impl, p.Spec.Limit, "window"), Impl: p.Impl, Where: where,
			Measured: fmt.Sprintf("at most %d in any %v (%d in any %v)", p.MostInCheck, p.Spec.checkSpan(), p.MostInWindow, p.Spec.Window),
			Met:      !p.Violation,
		})
	}
	return out
}
