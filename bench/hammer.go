package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// hammerSpec is the hammer table's load: Buckets limiters of one strategy,
// each on a client of its own (as processes of their own would be), with
// Goroutines goroutines each, calling one key flat out for Duration under
// a limit of Limit per Window.
type hammerSpec struct {
	Buckets, Goroutines, Limit int
	Window, Duration           time.Duration
}

// The hammer: 3 Buckets x 32 goroutines on a 50-per-second key for
// 4.5 s; the quick one is smaller and shorter.
var (
	fullHammer  = hammerSpec{Buckets: 3, Goroutines: 32, Limit: 50, Window: time.Second, Duration: 4500 * time.Millisecond}
	quickHammer = hammerSpec{Buckets: 3, Goroutines: 8, Limit: 50, Window: time.Second, Duration: 1500 * time.Millisecond}
)

// ideal is the most a limiter can admit in Duration without ever admitting
// more than Limit in one Window: Limit at once in every started window.
func (h hammerSpec) ideal() int64 {
	return int64(h.Limit) * int64(math.Ceil(float64(h.Duration)/float64(h.Window)))
}

// checkSpan is the span in which at most Limit calls may be decided: the
// window less the millisecond that Redis time is rounded down to.
func (h hammerSpec) checkSpan() time.Duration { return h.Window - time.Millisecond }

// hammerRow is one strategy under the hammer.
type hammerRow struct {
	Impl string
	Spec hammerSpec
	measures
	Admitted int64
	Ideal    int64
	// The most admitted calls sent and answered within one span of Window,
	// and of Window less a millisecond: Redis time is kept in whole
	// milliseconds, so calls decided 999.1 ms apart may carry times 1 000 ms
	// apart, in two windows. The second is the one checked.
	MostInWindow, MostInCheck int64
	Check                     string
	Violation                 bool
}

// ofIdeal is the admitted calls as a share of the ideal, in %.
func (h hammerRow) ofIdeal() float64 { return 100 * float64(h.Admitted) / float64(h.Ideal) }

// hammerTable is the hammer table: its measurement and its report, below.
var hammerTable = tableOf("hammer", "Hammer", func(res *results) *[]hammerRow { return &res.hammer }, report[hammerRow]{
	measure:  each(func() []impl { return filter(implementations(), ours) }, (*runner).hammer, hammerLog),
	markdown: hammerTableMD, title: "Hammer", method: hammerMethod, targets: hammerTargets, prose: hammerProse,
	checked: "hammer", check: func(r hammerRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// hammer runs the hammer on one strategy.
func (r *runner) hammer(ctx context.Context, im impl) (hammerRow, error) {
	h, s := r.cfg.hammer, r.sideOf(im)
	lims, clients, err := r.buckets(ctx, s, im, h)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	if err != nil {
		return hammerRow{}, err
	}
	if err := s.empty(ctx); err != nil {
		return hammerRow{}, err
	}
	w := workload{Name: "hammer", Resource: "hammer", Keys: 1, Goroutines: h.Buckets * h.Goroutines}
	got := load{w: w, lims: lims, tr: s.trips, d: h.Duration, timeout: r.cfg.timeout, spans: true}.run(ctx)
	if err := ctx.Err(); err != nil {
		return hammerRow{}, err
	}
	if err := checkSent(im, got); err != nil {
		return hammerRow{}, err
	}
	return summariseHammer(im, h, got), nil
}

// hammerLog is the line the run logs of a row.
func hammerLog(h hammerRow) string {
	return fmt.Sprintf("hammer %-33s admitted %d of the ideal %d (%.0f%%), at most %d in %v, %d in %v; %s",
		h.Impl, h.Admitted, h.Ideal, h.ofIdeal(), h.MostInWindow, h.Spec.Window, h.MostInCheck, h.Spec.checkSpan(), h.Check)
}

// buckets makes h.Buckets limiters, each on a client of its own whose pool
// is warm and whose limiter has made a call.
func (r *runner) buckets(ctx context.Context, s *side, im impl, h hammerSpec) ([]limiter, []*redis.Client, error) {
	var lims []limiter
	var clients []*redis.Client
	for range h.Buckets {
		c := s.more()
		clients = append(clients, c)
		lim, err := im.make(c, h.Limit, h.Window)
		if err != nil {
			return nil, clients, err
		}
		if err := warmPool(ctx, c, h.Goroutines); err != nil {
			return nil, clients, err
		}
		if _, err := lim.Allow(ctx, "warmup", "warmup"); err != nil {
			return nil, clients, fmt.Errorf("warm-up call: %w", err)
		}
		lims = append(lims, lim)
	}
	return lims, clients, nil
}

// summariseHammer computes the row and checks the admissions: never more
// than the limit in one window (counting the calls known to have been
// decided inside it), nor in all than the limit per started window.
func summariseHammer(im impl, h hammerSpec, got loadResult) hammerRow {
	out := hammerRow{
		Impl: im.name, Spec: h, measures: measure(got), Admitted: got.Admitted[0],
		Ideal: h.ideal(), MostInWindow: mostWithin(got.Spans, h.Window), MostInCheck: mostWithin(got.Spans, h.checkSpan()),
	}
	// A sliding window's bound in one span is its limit; a leaky bucket's
	// (GCRA), its burst and what drains in the span.
	bound, most := im.bound(h.Limit, h.Window, got.Elapsed), im.bound(h.Limit, h.Window, h.checkSpan())
	switch {
	case out.MostInCheck > most:
		out.Violation = true
		out.Check = fmt.Sprintf("OVER-ADMITTED: %d calls sent and answered within %v", out.MostInCheck, h.checkSpan())
	case out.Admitted > bound:
		out.Violation = true
		out.Check = fmt.Sprintf("OVER-ADMITTED: %d in %v, more than %d", out.Admitted, got.Elapsed.Round(time.Millisecond), bound)
	default:
		out.Check = "ok"
	}
	return out
}

// hammerTargets: never more than the limit in any second, and at least
// 80% of the ideal.
func hammerTargets(_ config, rows []hammerRow) []target {
	var out []target
	for _, h := range rows {
		where := fmt.Sprintf("hammer, %d Buckets x %d goroutines, %d/s, %v", h.Spec.Buckets, h.Spec.Goroutines, h.Spec.Limit, h.Spec.Duration)
		out = append(out, target{
			Target: spanTarget(h.Impl, h.Spec.Limit, "second"), Impl: h.Impl, Where: where,
			Measured: fmt.Sprintf("at most %d in any %v (%d in any %v)", h.MostInCheck, h.Spec.checkSpan(), h.MostInWindow, h.Spec.Window),
			Met:      !h.Violation,
		}, target{
			Target: "admitted >= 80% of the ideal", Impl: h.Impl, Where: where,
			Measured: fmt.Sprintf("%.0f%% (%d of %d)", h.ofIdeal(), h.Admitted, h.Ideal), Met: h.ofIdeal() >= 80,
		})
	}
	return out
}

// hammerTableMD is the hammer table.
func hammerTableMD(_ config, rows []hammerRow) string {
	var b strings.Builder
	s := rows[0].Spec
	fmt.Fprintf(&b, "| strategy | callers | limit | decisions/s | p50 | p99 | round trips / decision | admitted | ideal | of the ideal | most in any %v | most in any %v (checked) | errors | check |\n",
		s.Window, s.checkSpan())
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, h := range rows {
		fmt.Fprintf(&b, "| %s | %d Buckets x %d goroutines, %v | %d/%s | %s | %v | %v | %.2f | %d | %d | %.0f%% | %d | %d | %s | %s |\n",
			h.Impl, h.Spec.Buckets, h.Spec.Goroutines, h.Spec.Duration, h.Spec.Limit, shortDur(h.Spec.Window),
			rate(h.Rate), round(h.P50), round(h.P99), h.Trips, h.Admitted, h.Ideal, h.ofIdeal(), h.MostInWindow, h.MostInCheck,
			errorsCell(h.Errors, h.FirstErr), h.Check)
	}
	return b.String()
}

// hammerMethod says how the hammer table is measured.
func hammerMethod(_ config, rows []hammerRow) string {
	h := rows[0].Spec
	return fmt.Sprintf("%d Buckets of one strategy, each on a client of its own as separate processes would be, call one key with %d goroutines each (%d callers), flat out for %v, under `PerClient(Per(%d, %v))`. ",
		h.Buckets, h.Goroutines, h.Buckets*h.Goroutines, h.Duration, h.Limit, h.Window) +
		fmt.Sprintf("The ideal is the most a limiter can admit in %v without ever admitting more than %d in one %v: %d at once in each of the %d windows the run starts, %d. ",
			h.Duration, h.Limit, h.Window, h.Limit, h.ideal()/int64(h.Limit), h.ideal()) +
		fmt.Sprintf("\"Most in any %v\" counts the admitted calls that were both sent and answered within one span of that length, so each was decided inside it, over every such span. "+
			"The check uses spans of %v: Redis time, which the limiter reads, is kept in whole milliseconds, so two calls decided 999.1 ms apart may carry times 1 000 ms apart and rightly fall in two windows; more than %d in any %v span, or more than %d per started window in all, is an over-admission and fails the run.",
			h.Window, h.checkSpan(), h.Limit, h.checkSpan(), h.Limit)
}

func hammerProse(b *strings.Builder, _ config, rows []hammerRow) {
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
