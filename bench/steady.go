package main

import (
	"context"
	"fmt"
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
	Clients, Goroutines, Limit int
	Window, Cell, Steady       time.Duration
}

var (
	fullSteady  = steadySpec{Clients: 10_000, Goroutines: 32, Limit: 1_000_000, Window: time.Minute, Cell: 2 * time.Second, Steady: 16 * time.Second}
	quickSteady = steadySpec{Clients: 1_000, Goroutines: 8, Limit: 1_000_000, Window: time.Second, Cell: 150 * time.Millisecond, Steady: 600 * time.Millisecond}
)

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

// steadyAll runs the steady table for SortedSet and Windows (Logs, at
// under 2 000 decisions/s on distinct clients, has no target there).
func (r *runner) steadyAll(ctx context.Context, res *results) error {
	peer := r.impls(func(im impl) bool { return im.name == redisRateName })
	if len(peer) == 0 {
		return nil
	}
	for _, im := range r.impls(func(im impl) bool { return im.name == sortedSetName || im.name == windowsName }) {
		t0 := time.Now()
		row, err := r.steady(ctx, im, peer[0])
		if err != nil {
			return fmt.Errorf("%s: %w", im.name, err)
		}
		st := row.Phases[phaseSteady]
		fmt.Fprintf(r.log, "bench: steady %-33s first pair %.2fx, steady %.2fx redis_rate (%s vs %s/s, pairs %.2f–%.2fx), p99 %v vs %v; %d keys, %s (%.1fs)\n",
			im.name, row.Phases[phaseFirst].Ratio(), st.Ratio(), rate(st.Ours.Rate), rate(st.Peer.Rate), st.RatioMin, st.RatioMax,
			round(st.Ours.P99), round(st.Peer.P99), row.Keys, megabytes(row.Memory), time.Since(t0).Seconds())
		res.steady = append(res.steady, row)
	}
	return nil
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

// addCell adds a cell's decisions, time, latencies, round trips and
// errors to r's.
func (r *loadResult) addCell(c loadResult) {
	r.Decisions, r.Elapsed, r.Trips, r.Errors = r.Decisions+c.Decisions, r.Elapsed+c.Elapsed, r.Trips+c.Trips, r.Errors+c.Errors
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
func (r *runner) steady(ctx context.Context, im, peer impl) (steadyRow, error) {
	spec := r.cfg.steady
	w := spec.workload()
	ours, err := prepare(ctx, r.lib, im, spec.Limit, spec.Window, spec.Goroutines)
	if err != nil {
		return steadyRow{}, err
	}
	theirs, err := prepare(ctx, r.peers, peer, spec.Limit, spec.Window, spec.Goroutines)
	if err != nil {
		return steadyRow{}, err
	}
	var acc [phases]steadyAcc
	start := time.Now()
	for pair := 0; time.Since(start) < spec.Window+spec.Steady; pair++ {
		at := time.Since(start)
		a := load{w: w, lims: []limiter{ours}, tr: r.lib.trips, d: spec.Cell, timeout: r.cfg.timeout}.run(ctx)
		b := load{w: w, lims: []limiter{theirs}, tr: r.peers.trips, d: spec.Cell, timeout: r.cfg.timeout}.run(ctx)
		if err := ctx.Err(); err != nil {
			return steadyRow{}, err
		}
		if err := checkSent(im, a); err != nil {
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
