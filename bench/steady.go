package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The steady table: the distinct-clients workload as a service runs it,
// not from an empty database. The throughput table starts each cell on an
// empty database and runs it for 4 s of a one-minute window, so each
// client's keys hold at most 4 s of calls; a service that has run for a
// window holds a whole window of them, and SortedSet's sets and Windows'
// hashes (one field per interval called in) are that much bigger. Here one
// strategy and redis_rate alternate in cells of Cell, on databases that
// are emptied only before the first, until Steady has passed beyond one
// window since the first call: the cells of the first window build the
// state up, the later ones run on a full window.
type steadySpec struct {
	Clients, Goroutines int
	PerMinute           int // the limit, per minute: the window's is as much per minute
	Window, Cell        time.Duration
	Steady              time.Duration
}

// The table runs at two windows: 10 s, where a client's set or hash holds
// little, and a minute, where Windows' hash holds 1 200 intervals.
var (
	fullSteady = []steadySpec{
		{Clients: 10_000, Goroutines: 32, PerMinute: 1_000_000, Window: 10 * time.Second, Cell: 2 * time.Second, Steady: 16 * time.Second},
		{Clients: 10_000, Goroutines: 32, PerMinute: 1_000_000, Window: time.Minute, Cell: 2 * time.Second, Steady: 16 * time.Second},
	}
	quickSteady = []steadySpec{
		{Clients: 1_000, Goroutines: 8, PerMinute: 1_000_000, Window: time.Second / 2, Cell: 150 * time.Millisecond, Steady: 300 * time.Millisecond},
		{Clients: 1_000, Goroutines: 8, PerMinute: 1_000_000, Window: time.Second, Cell: 150 * time.Millisecond, Steady: 600 * time.Millisecond},
	}
)

// Limit is the limit per Window: PerMinute, prorated.
func (s steadySpec) Limit() int {
	return int(int64(s.PerMinute) * int64(s.Window) / int64(time.Minute))
}

func (s steadySpec) workload() workload {
	return workload{Name: fmt.Sprintf("%s distinct clients of one resource, %d goroutines", thousands(int64(s.Clients)), s.Goroutines),
		Resource: "steady", Keys: s.Clients, Goroutines: s.Goroutines}
}

// The phases of a steady run, by when a pair of cells starts.
const (
	phaseFirst  = iota // the first pair, on empty databases
	phaseBuild         // the other pairs of the first window
	phaseSteady        // the pairs that start a window or more after the first call
	phases
)

var phaseNames = [phases]string{"first pair (empty database)", "building up (the rest of the first window)", "steady (a window or more after the first call)"}

// steadyPhase is what the cells of one phase measured, both limiters.
type steadyPhase struct {
	Pairs              int
	Ours, Peer         measures
	RatioMin, RatioMax float64 // of one pair's decisions/s
}

// Ratio is the phase's decisions/s against redis_rate's.
func (p steadyPhase) Ratio() float64 { return p.Ours.Rate / max(p.Peer.Rate, 1e-9) }

// steadyRow is one strategy's steady run.
type steadyRow struct {
	Impl   string
	Spec   steadySpec
	Phases [phases]steadyPhase
	Keys   int64 // in the library's database at the end
	Memory int64 // used_memory of the library's server at the end, bytes
	Errors int64
}

// steadyTable is the steady state table: its measurement and its report, below.
var steadyTable = tableOf("steady", "Steady state", func(res *results) *[]steadyRow { return &res.steady }, report[steadyRow]{
	measure:  (*runner).steadyAll,
	markdown: steadyTableMD, title: "Steady state: the distinct-clients workload as a service runs it", method: steadyMethod, notes: steadyNotes,
	targets: steadyTargets, prose: steadyProse,
})

// steadyAll runs the steady table for SortedSet, Windows and GCRA (Logs,
// at under 2 000 decisions/s on distinct clients, has no target there),
// at each window.
func (r *runner) steadyAll(ctx context.Context) ([]steadyRow, error) {
	var out []steadyRow
	peer := r.impls(func(im impl) bool { return im.name == redisRateName })
	if len(peer) == 0 {
		return out, nil
	}
	for _, spec := range r.cfg.steady {
		for _, im := range r.impls(func(im impl) bool {
			return im.name == sortedSetName || im.name == windowsName || im.name == gcraName
		}) {
			t0 := time.Now()
			row, err := r.steady(ctx, spec, im, peer[0])
			if err != nil {
				return nil, fmt.Errorf("%s, %v window: %w", im.name, spec.Window, err)
			}
			st := row.Phases[phaseSteady]
			fmt.Fprintf(r.log, "bench: steady %-33s %v window: first pair %.2fx, steady %.2fx redis_rate (%s vs %s/s, pairs %.2f–%.2fx), p99 %v vs %v, CPU client %s vs %s, Redis %s vs %s; %d keys, %s (%.1fs)\n",
				im.name, spec.Window, row.Phases[phaseFirst].Ratio(), st.Ratio(), rate(st.Ours.Rate), rate(st.Peer.Rate), st.RatioMin, st.RatioMax,
				round(st.Ours.P99), round(st.Peer.P99), micros(st.Ours.ClientCPU), micros(st.Peer.ClientCPU), micros(st.Ours.ServerCPU), micros(st.Peer.ServerCPU),
				row.Keys, megabytes(row.Memory), time.Since(t0).Seconds())
			out = append(out, row)
		}
	}
	return out, nil
}

// steadyAcc gathers the cells of one phase.
type steadyAcc struct {
	ours, peer loadResult
	pairs      int
	ratios     []float64
}

func (a *steadyAcc) add(ours, peer loadResult) {
	a.ours.addCell(ours)
	a.peer.addCell(peer)
	a.pairs++
	a.ratios = append(a.ratios, (float64(ours.Decisions)/ours.Elapsed.Seconds())/(float64(peer.Decisions)/peer.Elapsed.Seconds()))
}

// addCell adds a cell's decisions, time, CPU time, latencies, round trips
// and errors to r's.
func (r *loadResult) addCell(c loadResult) {
	r.Decisions, r.Elapsed, r.Trips, r.Errors = r.Decisions+c.Decisions, r.Elapsed+c.Elapsed, r.Trips+c.Trips, r.Errors+c.Errors
	r.CPU.Client, r.CPU.Server = r.CPU.Client+c.CPU.Client, r.CPU.Server+c.CPU.Server
	r.measured = r.measured || c.measured
	r.Latencies = append(r.Latencies, c.Latencies...)
	if r.FirstErr == "" {
		r.FirstErr = c.FirstErr
	}
}

func (a *steadyAcc) phase() steadyPhase {
	if a.pairs == 0 {
		return steadyPhase{}
	}
	lo, hi := a.ratios[0], a.ratios[0]
	for _, x := range a.ratios {
		lo, hi = min(lo, x), max(hi, x)
	}
	return steadyPhase{Pairs: a.pairs, Ours: measure(a.ours), Peer: measure(a.peer), RatioMin: lo, RatioMax: hi}
}

// steady alternates im's cells with the peer's until Steady has passed
// beyond one window.
func (r *runner) steady(ctx context.Context, spec steadySpec, im, peer impl) (steadyRow, error) {
	w := spec.workload()
	ours, err := prepare(ctx, r.lib, im, spec.Limit(), spec.Window, spec.Goroutines)
	if err != nil {
		return steadyRow{}, err
	}
	theirs, err := prepare(ctx, r.peers, peer, spec.Limit(), spec.Window, spec.Goroutines)
	if err != nil {
		return steadyRow{}, err
	}
	var acc [phases]steadyAcc
	start := time.Now()
	for pair := 0; time.Since(start) < spec.Window+spec.Steady; pair++ {
		at := time.Since(start)
		a := load{w: w, lims: []limiter{ours}, tr: r.lib.trips, d: spec.Cell, timeout: r.cfg.timeout, cpu: &r.lib.meter}.run(ctx)
		b := load{w: w, lims: []limiter{theirs}, tr: r.peers.trips, d: spec.Cell, timeout: r.cfg.timeout, cpu: &r.peers.meter}.run(ctx)
		if err := ctx.Err(); err != nil {
			return steadyRow{}, err
		}
		if err := errors.Join(checkSent(im, a), checkSent(peer, b)); err != nil {
			return steadyRow{}, err
		}
		acc[phaseOf(pair, at, spec.Window)].add(a, b)
	}
	out := steadyRow{Impl: im.name, Spec: spec}
	for i := range acc {
		out.Phases[i] = acc[i].phase()
		out.Errors += acc[i].ours.Errors + acc[i].peer.Errors
	}
	if out.Keys, err = r.lib.admin.DBSize(ctx).Result(); err != nil {
		return out, err
	}
	out.Memory, err = usedMemory(ctx, r.lib.admin)
	return out, err
}

func phaseOf(pair int, at, window time.Duration) int {
	switch {
	case pair == 0:
		return phaseFirst
	case at < window:
		return phaseBuild
	default:
		return phaseSteady
	}
}

func megabytes(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// The report of the steady table: its section, its targets, its prose.

// steadyTableMD is the steady table: one row per strategy, window and
// phase.
func steadyTableMD(_ config, rows []steadyRow) string {
	var b strings.Builder
	b.WriteString("| strategy | window | phase | pairs | decisions/s | redis_rate's | vs redis_rate | one pair's ratio | p99 | redis_rate's p99 | client CPU / decision, vs redis_rate's | Redis CPU / decision, vs redis_rate's | round trips / decision | errors |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		for i, p := range r.Phases {
			if p.Pairs == 0 {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %.2fx | %.2f–%.2fx | %v | %v | %s | %s | %.2f | %s |\n",
				r.Impl, r.Spec.Window, phaseNames[i], p.Pairs, rate(p.Ours.Rate), rate(p.Peer.Rate), p.Ratio(), p.RatioMin, p.RatioMax,
				round(p.Ours.P99), round(p.Peer.P99), cpuVs(p.Ours.ClientCPU, p.Peer.ClientCPU), cpuVs(p.Ours.ServerCPU, p.Peer.ServerCPU),
				p.Ours.Trips, errorsCell(p.Ours.Errors+p.Peer.Errors, p.Ours.FirstErr+p.Peer.FirstErr))
		}
	}
	return b.String()
}

// cpuVs is "17.6 vs 14.6 µs (1.20x)".
func cpuVs(ours, peer float64) string {
	if ours < 0 || peer <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f vs %.1f µs (%.2fx)", ours, peer, ours/peer)
}

func steadyMethod(_ config, rows []steadyRow) string {
	s := rows[0].Spec
	var windows []string
	for _, spec := range uniqueSpecs(rows) {
		windows = append(windows, fmt.Sprintf("%v (%s per window)", spec.Window, thousands(int64(spec.Limit()))))
	}
	return fmt.Sprintf("The throughput table starts every cell on an empty database and runs it for a few seconds of a one-minute window, so each client's keys hold only those seconds of calls. "+
		"A service that has run for a window holds a whole window of them: SortedSet's set per client and Windows' hash per client and epoch (a field for every %v interval the client was called in, and their total) are that much bigger, and so is every transaction that reads them. "+
		"Here, as an independent harness measured it, %s (called round-robin), at %s/min and two windows, %s, a pool of %d connections, run in cells of %v that alternate one strategy with redis_rate, on databases emptied only before the first cell, for %v past one window. "+
		"Phases are by when a pair of cells starts; the targets are judged on the steady phase. Each strategy's keys hold the calls of its own cells, half of the time, as in the harness. Logs (under 2 000 decisions/s on distinct clients, no target there) is not run. "+
		"CPU per decision is each side's CPU time over the cells' decisions: the bench process's (getrusage) and the server's (INFO cpu, used_cpu_user + used_cpu_sys) of the implementation's own server (this library's, scripting denied; redis_rate's, which allows scripting; each idles while the other's cell runs), read just before and after each cell, less what each spends idle; the client's includes the harness's own work per call, the same on both sides.",
		windowsPrecision, s.workload().Name, thousands(int64(s.PerMinute)), strings.Join(windows, " and "), poolSize, s.Cell, s.Steady)
}

// steadyNotes say what each run left in the library's server.
func steadyNotes(_ config, rows []steadyRow) string {
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "At the end of %s's run at a %v window the library's database held %s keys and its server %s (used_memory).\n", r.Impl, r.Spec.Window, thousands(r.Keys), megabytes(r.Memory))
	}
	return b.String() + "\n"
}

// uniqueSpecs are the specs of the rows, each once, in order.
func uniqueSpecs(rows []steadyRow) []steadySpec {
	var out []steadySpec
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1] != r.Spec {
			out = append(out, r.Spec)
		}
	}
	return out
}

// steadyTargets judge the steady phase of the steady table, what users
// get: Windows >= 1.2x redis_rate's decisions/s, SortedSet >= 1.0x; for
// both a p99 at most 1.5x redis_rate's, a client CPU per decision at most
// redis_rate's client's, and a Redis CPU per decision at most 0.8x
// redis_rate's server's. GCRA, two round trips where redis_rate takes
// one: >= 0.8x, p99 at most 2x and Redis CPU per decision at most 1.0x,
// as its issue set them.
func steadyTargets(_ config, rows []steadyRow) []target {
	var out []target
	for _, r := range rows {
		p := r.Phases[phaseSteady]
		if p.Pairs == 0 {
			continue
		}
		where := fmt.Sprintf("steady state, %v window, %s, %s/min, %v cells alternating", r.Spec.Window, r.Spec.workload().Name, thousands(int64(r.Spec.PerMinute)), r.Spec.Cell)
		ours, peer := row{Impl: r.Impl, measures: p.Ours}, row{measures: p.Peer}
		if r.Impl == gcraName {
			out = append(out, rateTarget(ours, peer, 0.8, where), p99Target(ours, peer, where), serverCPUTarget(ours, peer, 1.0, where))
			continue
		}
		least := 1.0
		if r.Impl == windowsName {
			least = 1.2
		}
		out = append(out, rateTarget(ours, peer, least, where), p99Target(ours, peer, where),
			ratioTarget("client CPU / decision <= 1.0x redis_rate's", r.Impl, where, p.Ours.ClientCPU/p.Peer.ClientCPU, 1.0, false,
				fmt.Sprintf("%.1f vs %.1f µs", p.Ours.ClientCPU, p.Peer.ClientCPU)),
			serverCPUTarget(ours, peer, 0.8, where))
	}
	return out
}

// steadyProse says what the steady table shows against the throughput
// table's fresh cells.
func steadyProse(b *strings.Builder, _ config, rows []steadyRow) {
	var parts []string
	for _, r := range rows {
		f, s := r.Phases[phaseFirst], r.Phases[phaseSteady]
		parts = append(parts, fmt.Sprintf("%s at %v, %.2fx redis_rate in the first pair of cells, on an empty database, and %.2fx (pairs %.2f–%.2fx) once a window of state was there, at %s client and %s Redis CPU per decision against redis_rate's %s and %s",
			r.Impl, r.Spec.Window, f.Ratio(), s.Ratio(), s.RatioMin, s.RatioMax, micros(s.Ours.ClientCPU), micros(s.Ours.ServerCPU), micros(s.Peer.ClientCPU), micros(s.Peer.ServerCPU)))
	}
	fmt.Fprintf(b, "- **In a steady state** (the distinct-clients workload alternating with redis_rate, as a service runs it): %s. "+
		"The throughput table's cells start on an empty database and last a few seconds of the window, so each client's set or hash holds a few calls; "+
		"after a window it holds the window's, and each decision's transaction (Windows: the epochs' totals far from the limit, every interval near it; SortedSet: a trim of the calls that leave the window) and Redis's memory grow with it, while redis_rate keeps one small key per client.\n",
		strings.Join(parts, "; "))
}
