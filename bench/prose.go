package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// whereTheTimeGoes explains the tables, quoting their figures; what a run
// did not measure (-impl, -workload, -table) prints as "–".
func whereTheTimeGoes(cfg config, res results) string {
	var b strings.Builder
	if len(res.rows) > 0 {
		distinctProse(&b, res.rows)
		hotProse(&b, cfg, res.rows)
	}
	if len(res.hammer) > 0 {
		hammerProse(&b, res.hammer)
	}
	if len(res.noisy) > 0 {
		noisyProse(&b, res.noisy)
	}
	if len(res.steady) > 0 {
		steadyProse(&b, res.steady)
	}
	if len(res.cost) > 0 {
		costProse(&b, cfg, res.cost)
	}
	return b.String()
}

// cells are the rows of impls (all, if none is named) that keep keeps.
func cells(rows []row, keep func(row) bool, impls ...string) []row {
	return filter(rows, func(r row) bool { return keep(r) && (len(impls) == 0 || slices.Contains(impls, r.Impl)) })
}

func distinct(r row) bool { return r.Workload.Keys > 1 }
func hot(r row) bool      { return r.Workload.Keys == 1 }

// at keeps the rows of one shape at one limit.
func at(shape func(row) bool, limit int) func(row) bool {
	return func(r row) bool { return shape(r) && r.Limit == limit }
}

// spanOf formats the smallest and the largest of vals: "a–b", or one
// figure when they agree.
func spanOf(vals []float64, format func(float64) string) string {
	if len(vals) == 0 {
		return "–"
	}
	a, b := format(slices.Min(vals)), format(slices.Max(vals))
	if a == b {
		return a
	}
	return a + "–" + b
}

func spanRows(rs []row, value func(row) float64, format func(float64) string) string {
	vals := make([]float64, len(rs))
	for i, r := range rs {
		vals[i] = value(r)
	}
	return spanOf(vals, format)
}

// spanVs is the span of decisions/s over rs divided by impl's in the same
// cells of all.
func spanVs(all, rs []row, impl string) string {
	var ratios []float64
	for _, r := range rs {
		if o, ok := find(all, r, impl); ok && o.Rate > 0 {
			ratios = append(ratios, r.Rate/o.Rate)
		}
	}
	return spanOf(ratios, func(x float64) string { return fmt.Sprintf("%.2f", x) }) + "x"
}

func rateOf(r row) float64      { return r.Rate }
func tripsOf(r row) float64     { return r.Trips }
func p99Of(r row) float64       { return float64(r.P99) }
func tripsFmt(x float64) string { return fmt.Sprintf("%.2f", x) }
func latency(x float64) string  { return round(time.Duration(x)).String() }
