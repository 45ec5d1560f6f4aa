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

// speedup is one target on decisions/s against redis_rate.
type speedup struct {
	impl string
	min  float64
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
