package main

import (
	"fmt"
	"strings"
)

// A target is one of issue 11's (or 13's, 19's), judged on one run's
// figures.
type target struct {
	Target   string // what is asked
	Impl     string
	Where    string // the cell judged
	Measured string
	Met      bool
}

// targets judges issue 11's targets on res; a target whose figures were
// not measured (-impl, -workload, -table) is left out.
func targets(cfg config, res results) []target {
	var out []target
	for _, w := range cfg.workloads {
		for _, limit := range cfg.limits {
			out = append(out, throughputTargets(res.rows, w, limit, limit == cfg.limits[0])...)
		}
	}
	out = append(out, steadyTargets(res.steady)...)
	out = append(append(out, hammerTargets(res.hammer)...), noisyTargets(res.noisy)...)
	out = append(append(out, abuserTargets(res.abuser)...), procsTargets(res.procs)...)
	return append(out, inProcessTargets(res.inProcess)...)
}

// abuserTargets (issue 19): beside a client past its own limit, >= 95% of
// the polite calls admitted, for this library's strategies.
func abuserTargets(rows []abuserRow) []target {
	var out []target
	for _, a := range rows {
		if !isOurs(a.Impl) {
			continue
		}
		least := (95*a.Spec.Polite + 99) / 100
		out = append(out, target{
			Target: fmt.Sprintf("polite calls admitted >= %d of %d", least, a.Spec.Polite), Impl: a.Impl,
			Where:    fmt.Sprintf("abuser at its own limit, %d Buckets x %d goroutines; a call every %v from a fresh client", a.Spec.Buckets, a.Spec.Goroutines, a.Spec.Pace),
			Measured: fmt.Sprintf("%d of %d (abuser: %.3f round trips per call)", a.Admitted, a.Spec.Polite, a.AbuserTrips), Met: a.Admitted >= int64(least),
		})
	}
	return out
}

// procsTargets (issue 19): processes on one key admit >= 90% of the most
// possible, and never more than the limit in a window.
func procsTargets(rows []procsRow) []target {
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
			Target: fmt.Sprintf("never more than %d in any window", p.Spec.Limit), Impl: p.Impl, Where: where,
			Measured: fmt.Sprintf("at most %d in any %v (%d in any %v)", p.MostInCheck, p.Spec.checkSpan(), p.MostInWindow, p.Spec.Window),
			Met:      p.MostInCheck <= int64(p.Spec.Limit),
		})
	}
	return out
}

// speedup is one target on decisions/s against redis_rate.
type speedup struct {
	impl string
	min  float64
}

// throughputTargets: on distinct keys Windows >= 1.2x redis_rate and
// SortedSet >= 1.0x; on a hot key both >= 1.0x; their p99 at most 1.5x
// redis_rate's; and on a hot key at the lowest limit, Logs >= 1.0x with
// at most 2 round trips per decision.
func throughputTargets(rows []row, w workload, limit int, lowest bool) []target {
	rr, ok := findCell(rows, w, limit, redisRateName)
	if !ok {
		return nil
	}
	where := fmt.Sprintf("%s, %s/min", w.Name, thousands(int64(limit)))
	speedups := []speedup{{windowsName, 1.0}, {sortedSetName, 1.0}}
	if w.Keys > 1 {
		speedups[0].min = 1.2
	}
	var out []target
	for _, s := range speedups {
		if r, ok := findCell(rows, w, limit, s.impl); ok {
			out = append(out, rateTarget(r, rr, s.min, where), p99Target(r, rr, where))
		}
	}
	if r, ok := findCell(rows, w, limit, logsName); ok && w.Keys == 1 && lowest {
		out = append(out, rateTarget(r, rr, 1.0, where), target{
			Target: "round trips per decision <= 2", Impl: r.Impl, Where: where,
			Measured: fmt.Sprintf("%.2f", r.Trips), Met: r.Trips <= 2.0001,
		})
	}
	return out
}

func findCell(rows []row, w workload, limit int, impl string) (row, bool) {
	for _, r := range rows {
		if r.Workload.Name == w.Name && r.Limit == limit && r.Impl == impl {
			return r, true
		}
	}
	return row{}, false
}

func rateTarget(r, rr row, least float64, where string) target {
	return ratioTarget(fmt.Sprintf("decisions/s >= %.1fx redis_rate", least), r.Impl, where,
		r.Rate/rr.Rate, least, true, fmt.Sprintf("%s vs %s", rate(r.Rate), rate(rr.Rate)))
}

func p99Target(r, rr row, where string) target {
	return ratioTarget("p99 <= 1.5x redis_rate's", r.Impl, where,
		float64(r.P99)/float64(rr.P99), 1.5, false, fmt.Sprintf("%v vs %v", round(r.P99), round(rr.P99)))
}

// ratioTarget is a target on x, a ratio to redis_rate's figure: at least
// bound, or (atLeast false) at most. Measured is x and detail, and for a
// miss, by how much it missed.
func ratioTarget(name, impl, where string, x, bound float64, atLeast bool, detail string) target {
	t := target{Target: name, Impl: impl, Where: where, Measured: fmt.Sprintf("%.2fx (%s)", x, detail)}
	switch {
	case atLeast && x >= bound, !atLeast && x <= bound:
		t.Met = true
	case atLeast:
		t.Measured += fmt.Sprintf("; missed by %.2fx, %.0f%% short of %.1fx", bound-x, 100*(1-x/bound), bound)
	default:
		t.Measured += fmt.Sprintf("; missed by %.2fx, %.0f%% over %.1fx", x-bound, 100*(x/bound-1), bound)
	}
	return t
}

// hammerTargets: never more than the limit in any second, and at least
// 80% of the ideal.
func hammerTargets(rows []hammerRow) []target {
	var out []target
	for _, h := range rows {
		where := fmt.Sprintf("hammer, %d Buckets x %d goroutines, %d/s, %v", h.Spec.Buckets, h.Spec.Goroutines, h.Spec.Limit, h.Spec.Duration)
		out = append(out, target{
			Target: fmt.Sprintf("never more than %d in any second", h.Spec.Limit), Impl: h.Impl, Where: where,
			Measured: fmt.Sprintf("at most %d in any %v (%d in any %v)", h.MostInCheck, h.Spec.checkSpan(), h.MostInWindow, h.Spec.Window),
			Met:      h.MostInCheck <= int64(h.Spec.Limit),
		}, target{
			Target: "admitted >= 80% of the ideal", Impl: h.Impl, Where: where,
			Measured: fmt.Sprintf("%.0f%% (%d of %d)", h.ofIdeal(), h.Admitted, h.Ideal), Met: h.ofIdeal() >= 80,
		})
	}
	return out
}

// noisyTargets: the other clients at least 95% served, for this library's
// strategies (the peers' rows are there to compare with).
func noisyTargets(rows []noisyRow) []target {
	var out []target
	for _, n := range rows {
		if !isOurs(n.Impl) {
			continue
		}
		out = append(out, target{
			Target: "other clients >= 95% served", Impl: n.Impl,
			Where:    fmt.Sprintf("noisy neighbour, %d goroutines past %d/%s", n.Spec.Noisy, n.Spec.Limit, shortDur(n.Spec.Window)),
			Measured: fmt.Sprintf("%.1f%% (%d of %d)", n.servedPct(), n.Served, n.Calls), Met: n.servedPct() >= 95,
		})
	}
	return out
}

func isOurs(name string) bool {
	for _, im := range implementations() {
		if im.name == name {
			return im.ours
		}
	}
	return false
}

// targetsTableMD is the target table, and how many were met.
func targetsTableMD(ts []target) string {
	var b strings.Builder
	met := 0
	b.WriteString("| target | strategy | where | measured | verdict |\n|---|---|---|---|---|\n")
	for _, t := range ts {
		verdict := "**MISSED**"
		if t.Met {
			verdict, met = "met", met+1
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", t.Target, t.Impl, t.Where, t.Measured, verdict)
	}
	fmt.Fprintf(&b, "\n%d of %d targets met.\n", met, len(ts))
	return b.String()
}
