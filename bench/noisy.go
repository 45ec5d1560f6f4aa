package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// noisySpec is the noisy-neighbour table's load, on one limiter shared by
// every client of one resource, as one service process serving them all
// would share it: one client calls flat out from Noisy goroutines, far past
// its per-client limit of Limit per Window, while Others clients call once
// every Pace each (under the limit), for Duration. Each of their calls must
// be answered before the next is due.
type noisySpec struct {
	Noisy, Others, Limit   int
	Window, Pace, Duration time.Duration
}

var (
	fullNoisy  = noisySpec{Noisy: 64, Others: 16, Limit: 20, Window: time.Second, Pace: 100 * time.Millisecond, Duration: 4 * time.Second}
	quickNoisy = noisySpec{Noisy: 16, Others: 8, Limit: 20, Window: time.Second, Pace: 100 * time.Millisecond, Duration: 500 * time.Millisecond}
)

// noisyRow is one implementation with a noisy neighbour.
type noisyRow struct {
	Impl string
	Spec noisySpec

	NoisyDecisions int64
	NoisyRate      float64 // decisions/s
	NoisyAdmitted  int64
	NoisyBound     int64

	Calls, Served, Denied, Late, Errors int64 // the others'
	FirstErr                            string
	P50, P99                            time.Duration // the others'
	Check                               string
	Violation                           bool
}

// servedPct is the share of the others' calls that were served, in %.
func (n noisyRow) servedPct() float64 { return 100 * float64(n.Served) / float64(max(n.Calls, 1)) }

// noisyTable is the noisy neighbour table: its measurement and its report, below.
var noisyTable = tableOf("neighbour", "Noisy neighbour", func(res *results) *[]noisyRow { return &res.noisy }, report[noisyRow]{
	measure:  each(func() []impl { return filter(implementations(), limits) }, (*runner).noisy, noisyLog),
	markdown: noisyTableMD, title: "Noisy neighbour", method: noisyMethod, targets: noisyTargets, prose: noisyProse,
	checked: "noisy neighbour", check: func(r noisyRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// noisy runs the noisy neighbour on one implementation.
func (r *runner) noisy(ctx context.Context, im impl) (noisyRow, error) {
	n, s := r.cfg.noisy, r.sideOf(im)
	lim, err := prepare(ctx, s, im, n.Limit, n.Window, n.Noisy+n.Others)
	if err != nil {
		return noisyRow{}, err
	}
	var noisy loadResult
	others := make([]pacedResult, n.Others)
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		w := workload{Name: "noisy", Resource: noisyResource, Keys: 1, Goroutines: n.Noisy}
		noisy = load{w: w, lims: []limiter{lim}, tr: s.trips, d: n.Duration, timeout: r.cfg.timeout}.run(ctx)
	})
	for i := range n.Others {
		// Spread the others over one pace, as independent clients are.
		first := start.Add(time.Duration(i) * n.Pace / time.Duration(n.Others))
		wg.Go(func() { others[i] = n.paced(ctx, lim, "client-"+strconv.Itoa(i), first) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return noisyRow{}, err
	}
	if err := checkSent(im, noisy); err != nil { // the others' commands are counted there too
		return noisyRow{}, err
	}
	return summariseNoisy(im, n, noisy, others), nil
}

// noisyLog is the line the run logs of a row.
func noisyLog(n noisyRow) string {
	return fmt.Sprintf("neighbour %-33s noisy %10.1f/s, others served %d of %d (%.1f%%), p99 %v; %s",
		n.Impl, n.NoisyRate, n.Served, n.Calls, n.servedPct(), round(n.P99), n.Check)
}

// noisyResource is the resource every client of the table calls; the noisy
// client is the workload's one key, "hot".
const noisyResource = "shared"

// pacedResult is what one well-behaved client saw.
type pacedResult struct {
	calls, served, denied, late, errs int64
	firstErr                          string
	admitted                          int64
	lat                               []int64
	elapsed                           time.Duration
}

// paced is one well-behaved client: a call every Pace from first, each
// given until the next is due.
func (n noisySpec) paced(ctx context.Context, lim limiter, client string, first time.Time) pacedResult {
	var out pacedResult
	for i := range int(n.Duration / n.Pace) {
		time.Sleep(time.Until(first.Add(time.Duration(i) * n.Pace)))
		if ctx.Err() != nil {
			break
		}
		s := time.Now()
		ok, err := allowWithin(ctx, lim, n.Pace, noisyResource, client)
		lat := time.Since(s)
		out.lat = append(out.lat, int64(lat))
		out.note(ok, err, lat > n.Pace)
	}
	out.elapsed = time.Since(first)
	return out
}

// note counts one call: served if admitted without error, in time. A call
// may answer after its deadline: go-redis, by default, does not stop a
// command when its context ends.
func (p *pacedResult) note(ok bool, err error, late bool) {
	p.calls++
	if ok {
		p.admitted++
	}
	switch {
	case late || (err != nil && ctxErr(err)):
		p.late++
	case err != nil:
		p.errs++
		if p.firstErr == "" {
			p.firstErr = err.Error()
		}
	case ok:
		p.served++
	default:
		p.denied++
	}
}

// summariseNoisy computes the row and checks every client's admissions
// against the limit.
func summariseNoisy(im impl, n noisySpec, noisy loadResult, others []pacedResult) noisyRow {
	out := noisyRow{Impl: im.name, Spec: n, NoisyDecisions: noisy.Decisions, NoisyAdmitted: noisy.Admitted[0],
		NoisyRate: float64(noisy.Decisions) / noisy.Elapsed.Seconds(), NoisyBound: im.bound(n.Limit, n.Window, noisy.Elapsed)}
	var lat []int64
	var over []string
	for i, o := range others {
		out.Calls, out.Served, out.Denied, out.Late, out.Errors = out.Calls+o.calls, out.Served+o.served, out.Denied+o.denied, out.Late+o.late, out.Errors+o.errs
		if out.FirstErr == "" {
			out.FirstErr = o.firstErr
		}
		lat = append(lat, o.lat...)
		if b := im.bound(n.Limit, n.Window, o.elapsed); o.admitted > b {
			over = append(over, fmt.Sprintf("client-%d admitted %d > %d", i, o.admitted, b))
		}
	}
	sorted := sortedDurations(lat)
	out.P50, out.P99 = percentile(sorted, 50), percentile(sorted, 99)
	switch {
	case out.NoisyAdmitted > out.NoisyBound:
		out.Check, out.Violation = im.overAdmitted(fmt.Sprintf("the noisy client got %d > %d", out.NoisyAdmitted, out.NoisyBound))
	case len(over) > 0:
		out.Check, out.Violation = im.overAdmitted(over[0])
	default:
		out.Check = "ok"
	}
	return out
}

// ctxErr reports whether err is a call's deadline passing.
func ctxErr(err error) bool { return errors.Is(err, context.DeadlineExceeded) }

// noisyTargets: the other clients at least 95% served, for this library's
// strategies (the peers' rows are there to compare with).
func noisyTargets(_ config, rows []noisyRow) []target {
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

// noisyTableMD is the noisy-neighbour table.
func noisyTableMD(_ config, rows []noisyRow) string {
	return markdownTable("| implementation | noisy client: decisions/s | noisy: admitted / allowed | others: calls | served | of their calls | denied | late | errors | others' p50 | others' p99 | check |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|\n", rows, func(n noisyRow) string {
		return fmt.Sprintf("| %s | %s | %d / %d | %d | %d | %.1f%% | %d | %d | %s | %v | %v | %s |\n",
			n.Impl, rate(n.NoisyRate), n.NoisyAdmitted, n.NoisyBound, n.Calls, n.Served, n.servedPct(), n.Denied, n.Late,
			errorsCell(n.Errors, n.FirstErr), round(n.P50), round(n.P99), n.Check)
	})
}

// noisyMethod says how the noisy-neighbour table is measured.
func noisyMethod(_ config, rows []noisyRow) string {
	n := rows[0].Spec
	method := fmt.Sprintf("One limiter per implementation, shared by every client of one resource as one service process would share it, under `PerClient(Per(%d, %v))`. "+
		"For %v, one client calls flat out from %d goroutines, far past its limit, while %d other clients call once every %v each (%d calls a second, under the limit), spread over the %v. "+
		"A call of theirs is served if it is admitted, without error, before the client's next call is due (its context's deadline is %v); late calls answered after it, or failed for it (go-redis does not stop a command when its context ends, unless told to). The noisy client's admissions, and every other client's, are checked against the limit per started window.",
		n.Limit, n.Window, n.Duration, n.Noisy, n.Others, n.Pace, int(time.Second/n.Pace), n.Pace, n.Pace)
	return method
}

func noisyProse(b *strings.Builder, _ config, rows []noisyRow) {
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
