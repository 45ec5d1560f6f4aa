package main

import (
	"fmt"
	"strings"
)

// A target is one of issue 11's, judged on one run's figures.
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
	out = append(append(out, hammerTargets(res.hammer)...), noisyTargets(res.noisy)...)
	return append(out, inProcessTargets(res.inProcess)...)
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
	x := r.Rate / rr.Rate
	return target{
		Target: fmt.Sprintf("decisions/s >= %.1fx redis_rate", least), Impl: r.Impl, Where: where,
		Measured: fmt.Sprintf("%.2fx (%s vs %s)", x, rate(r.Rate), rate(rr.Rate)), Met: x >= least,
	}
}

func p99Target(r, rr row, where string) target {
	x := float64(r.P99) / float64(rr.P99)
	return target{
		Target: "p99 <= 1.5x redis_rate's", Impl: r.Impl, Where: where,
		Measured: fmt.Sprintf("%.2fx (%v vs %v)", x, round(r.P99), round(rr.P99)), Met: x <= 1.5,
	}
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
