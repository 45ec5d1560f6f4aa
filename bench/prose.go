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

func distinctProse(b *strings.Builder, rows []row) {
	ours := cells(rows, distinct, sortedSetName, windowsName)
	logs := cells(rows, distinct, logsName)
	fmt.Fprintf(b, "- **Distinct keys** (distinct clients of one resource): SortedSet and Windows decide the concurrent calls of a resource in one MULTI/EXEC per batch, two batches in flight, so a decision costs %s round trips; but each call brings its own set or hash, so a batch's transaction grows with its calls. Windows also reads each client's whole hash (HGETALL), marks each transaction (a SET of a short-lived key, so that a lost reply can be resolved) and reads the generation, and each of its denied calls must be taken back (by the next batch's transaction): its calls cost Redis more than the floor's SET, which is why neither strategy reaches the floor here. "+
		"SortedSet and Windows answer %s decisions/s, %s redis_rate (%s) and %s the floor (%s); ulule/limiter answers %s. "+
		"Logs takes its lock per client and walks the database with SCAN, where every batch of every client is a key: %s round trips and %s decisions/s.\n",
		spanRows(ours, tripsOf, tripsFmt), spanRows(ours, rateOf, rate), spanVs(rows, ours, redisRateName),
		spanRows(cells(rows, distinct, redisRateName), rateOf, rate), spanVs(rows, ours, floorName),
		spanRows(cells(rows, distinct, floorName), rateOf, rate), spanRows(cells(rows, distinct, ululeName), rateOf, rate),
		spanRows(logs, tripsOf, tripsFmt), spanRows(logs, rateOf, rate))
}

func hotProse(b *strings.Builder, cfg config, rows []row) {
	lo, hi := cfg.limits[0], cfg.limits[len(cfg.limits)-1]
	ours := []string{logsName, sortedSetName, windowsName}
	atLo := cells(rows, at(hot, lo), ours...)
	logged := cells(rows, at(hot, hi), logsName, sortedSetName)
	win := cells(rows, at(hot, hi), windowsName)
	fmt.Fprintf(b, "- **A hot key** is batched: the concurrent calls of one Bucket for one resource are decided together, in one MULTI/EXEC (SortedSet, Windows) or under one lock (Logs), so a decision costs %s round trips. "+
		"At %s/min the limit is soon reached and every later call is denied: the strategies answer %s decisions/s, %s redis_rate. "+
		"At %s/min every call is admitted and recorded: Logs SCANs every log key in the window and SortedSet adds to a set capped at the limit (O(log n)), %s decisions/s (%s redis_rate, p99 %s), while Windows adds to one hash of at most window / precision fields: %s (%s redis_rate, p99 %s).\n",
		spanRows(cells(rows, hot, ours...), tripsOf, tripsFmt),
		thousands(int64(lo)), spanRows(atLo, rateOf, rate), spanVs(rows, atLo, redisRateName),
		thousands(int64(hi)), spanRows(logged, rateOf, rate), spanVs(rows, logged, redisRateName), spanRows(logged, p99Of, latency),
		spanRows(win, rateOf, rate), spanVs(rows, win, redisRateName), spanRows(win, p99Of, latency))
}

func hammerProse(b *strings.Builder, rows []hammerRow) {
	h := rows[0].Spec
	var pct, most, most1s, p99 []float64
	for _, r := range rows {
		pct, most, most1s, p99 = append(pct, r.ofIdeal()), append(most, float64(r.MostInCheck)), append(most1s, float64(r.MostInWindow)), append(p99, float64(r.P99))
	}
	count := func(x float64) string { return fmt.Sprintf("%.0f", x) }
	fmt.Fprintf(b, "- **Under the hammer** the %d Buckets batch their own %d callers each; their transactions (Logs: their lock) meet in Redis. "+
		"The strategies admitted %s%% of the ideal %d, never more than %s calls in any %v (%s in any %v, the difference being Redis time's whole milliseconds), with a p99 of %s.\n",
		h.Buckets, h.Goroutines, spanOf(pct, count), h.ideal(), spanOf(most, count), h.checkSpan(), spanOf(most1s, count), h.Window, spanOf(p99, latency))
}

func noisyProse(b *strings.Builder, rows []noisyRow) {
	n := rows[0].Spec
	var ours, peers, oursP99 []float64
	for _, r := range rows {
		if isOurs(r.Impl) {
			ours, oursP99 = append(ours, r.servedPct()), append(oursP99, float64(r.P99))
		} else {
			peers = append(peers, r.servedPct())
		}
	}
	pct := func(x float64) string { return fmt.Sprintf("%.1f%%", x) }
	fmt.Fprintf(b, "- **With a noisy neighbour** calling from %d goroutines, the other clients were served %s by this library's strategies (their p99 %s against a deadline of %v) and %s by the peers. "+
		"Every rule being per client, each client counts in keys of its own (and, under Logs, takes a lock of its own), so the noisy client competes with the others only for Redis, the connection pool, the batches and the CPU.\n",
		n.Noisy, spanOf(ours, pct), spanOf(oursP99, latency), n.Pace, spanOf(peers, pct))
}

func costProse(b *strings.Builder, cfg config, rows []costRow) {
	first, last := rows[0], rows[len(rows)-1]
	fmt.Fprintf(b, "- **SortedSet's cost against its limit**: a decision trims, counts (ZCARD), reads the oldest and newest members and, if this process saw room, adds the call under the cap, each O(log n) in the set, which holds at most the limit. "+
		"With the window full, one decision of weight 2 (a look: no member written, the denial cache not asked) takes %v (p50) at a limit of %s/%s and %v at %s/%s: %s decisions/s against %s (%s slower), at %.2f round trips",
		round(first.P50), thousands(int64(first.Limit)), shortDur(cfg.window), round(last.P50), thousands(int64(last.Limit)), shortDur(cfg.window),
		rate(last.Rate), rate(first.Rate), slower(first.Rate, last.Rate), last.Trips)
	if last.Errors > 0 {
		fmt.Fprintf(b, "; %d of the %d decisions at %s/%s failed (%s)", last.Errors, last.Decisions, thousands(int64(last.Limit)), shortDur(cfg.window), last.FirstErr)
	}
	b.WriteString(".\n")
}
