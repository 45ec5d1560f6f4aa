package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// The replicas table: what WithReplicas costs. The library's server gets a
// replica of its own, on this machine, for the table's run; each strategy
// then runs cells of the distinct-clients workload that alternate the
// default Bucket with one WithReplicas(1, replicasWait), whose decisions
// each wait for the replica's acknowledgement (WAIT, in the decision's
// round trip). One goroutine shows a decision's latency alone; 32 show
// the rate of a resource whose calls are batched.

// replicasSpec is one workload of the table.
type replicasSpec struct {
	Clients, Goroutines int
	Cell                time.Duration
	Pairs               int // cells of each variant, alternating
}

var (
	fullReplicas = []replicasSpec{
		{Clients: 1_000, Goroutines: 1, Cell: 2 * time.Second, Pairs: 3},
		{Clients: 1_000, Goroutines: 32, Cell: 2 * time.Second, Pairs: 3},
	}
	quickReplicas = []replicasSpec{
		{Clients: 100, Goroutines: 1, Cell: 150 * time.Millisecond, Pairs: 1},
		{Clients: 100, Goroutines: 8, Cell: 150 * time.Millisecond, Pairs: 1},
	}
)

// The Bucket WithReplicas waits for one replica, at most replicasWait;
// each client may make replicasLimit calls per window, more than any cell
// makes, so that every call is admitted and written. Logs's SCAN walks
// the whole database, whose keys its own logs pile up within a cell:
// replicasScanCount makes it one page, so that its round trips are the
// decision's, with the option or without.
const (
	replicasWait      = 100 * time.Millisecond
	replicasLimit     = 1_000_000
	replicasScanCount = 1 << 20
)

func (s replicasSpec) workload() workload {
	return workload{Name: fmt.Sprintf("%s distinct clients of one resource, %d goroutine(s)", thousands(int64(s.Clients)), s.Goroutines),
		Resource: "replicas", Keys: s.Clients, Goroutines: s.Goroutines}
}

// replicasRow is one strategy's figures in one workload: its cells
// without the option and with it.
type replicasRow struct {
	Impl               string
	Spec               replicasSpec
	Default, Replicas  measures
	RatioMin, RatioMax float64 // of one pair's decisions/s, with / without
}

// Ratio is the decisions/s with the option against without.
func (r replicasRow) Ratio() float64 { return r.Replicas.Rate / max(r.Default.Rate, 1e-9) }

// replicasTable is the replicas table: its measurement and its report, below.
var replicasTable = tableOf("replicas", "Replicas", func(res *results) *[]replicasRow { return &res.replicas }, report[replicasRow]{
	measure:  (*runner).replicasAll,
	markdown: replicasTableMD, title: "Replicas", method: replicasMethod,
})

// replicasAll measures the replicas table: it starts the replica, and
// stops it when done.
func (r *runner) replicasAll(ctx context.Context) ([]replicasRow, error) {
	var out []replicasRow
	replica, err := startReplica(ctx, r.lib.srv)
	if err != nil {
		return nil, err
	}
	defer replica.stop()
	fmt.Fprintf(r.log, "bench: replicas: a replica of the library's server on %s\n", replica.addr)
	for _, spec := range r.cfg.replicas {
		for _, s := range strategies {
			if !r.cfg.impl.MatchString(s.name) || s.bucket {
				continue
			}
			row, err := r.replicasCell(ctx, spec, s.name, s.opts)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", s.name, spec.workload().Name, err)
			}
			fmt.Fprintf(r.log, "bench: replicas %-26s %2d goroutine(s): %s vs %s decisions/s (%.2fx, pairs %.2f–%.2fx), p50 %v vs %v, p99 %v vs %v, %.2f vs %.2f round trips\n",
				row.Impl, spec.Goroutines, rate(row.Replicas.Rate), rate(row.Default.Rate), row.Ratio(), row.RatioMin, row.RatioMax,
				round(row.Replicas.P50), round(row.Default.P50), round(row.Replicas.P99), round(row.Default.P99), row.Replicas.Trips, row.Default.Trips)
			out = append(out, row)
		}
	}
	return out, nil
}

// replicasCell alternates spec.Pairs cells of the strategy with options
// opts without WithReplicas and with it, each on an emptied database.
func (r *runner) replicasCell(ctx context.Context, spec replicasSpec, name string, opts []leakybucket.Option) (replicasRow, error) {
	if err := warmPool(ctx, r.lib.client, spec.Goroutines); err != nil {
		return replicasRow{}, err
	}
	opts = append(opts, leakybucket.WithScanCount(replicasScanCount))
	plain, err := newBucket(r.lib.client, replicasLimit, r.cfg.window, opts...)
	if err != nil {
		return replicasRow{}, err
	}
	waiting, err := newBucket(r.lib.client, replicasLimit, r.cfg.window, append(opts, leakybucket.WithReplicas(1, replicasWait))...)
	if err != nil {
		return replicasRow{}, err
	}
	w := spec.workload()
	var without, with loadResult
	row := replicasRow{Impl: name, Spec: spec}
	cell := func(b *leakybucket.Bucket) (loadResult, error) {
		if err := r.lib.empty(ctx); err != nil {
			return loadResult{}, err
		}
		got := load{w: w, lims: []limiter{libLimiter{b}}, tr: r.lib.trips, d: spec.Cell, timeout: r.cfg.timeout, cpu: &r.lib.meter}.run(ctx)
		return got, ctx.Err()
	}
	for pair := range spec.Pairs {
		a, err := cell(plain)
		if err != nil {
			return row, err
		}
		b, err := cell(waiting)
		if err != nil {
			return row, err
		}
		if err := errors.Join(checkSent(impl{}, a), checkSent(impl{}, b)); err != nil {
			return row, err
		}
		ratio := (float64(b.Decisions) / b.Elapsed.Seconds()) / (float64(a.Decisions) / a.Elapsed.Seconds())
		if pair == 0 {
			row.RatioMin, row.RatioMax = ratio, ratio
		}
		row.RatioMin, row.RatioMax = min(row.RatioMin, ratio), max(row.RatioMax, ratio)
		without.addCell(a)
		with.addCell(b)
	}
	row.Default, row.Replicas = measure(without), measure(with)
	return row, nil
}

// startReplica starts a replica of primary, scripting denied as on the
// primary, and waits until it acknowledges (see awaitAcknowledged).
func startReplica(ctx context.Context, primary *server) (*server, error) {
	host, port, err := splitAddr(primary.addr)
	if err != nil {
		return nil, err
	}
	var replica *server
	for range 5 {
		if replica, err = tryStart(ctx, false, "--replicaof", host, port, "--repl-diskless-sync-delay", "0"); err == nil {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	admin := primary.client(1)
	defer admin.Close()
	if err := awaitAcknowledged(ctx, admin); err != nil {
		replica.stop()
		return nil, fmt.Errorf("the replica on %s: %w", replica.addr, err)
	}
	return replica, nil
}

// awaitAcknowledged waits until the primary of admin has a replica online
// that acknowledged every write made before: right after its full sync a
// replica shows online while it still loads what it was sent, and
// acknowledges nothing yet.
func awaitAcknowledged(ctx context.Context, admin *redis.Client) error {
	written, err := replicationField(ctx, admin, "master_repl_offset")
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		slave0, err := replicationField(ctx, admin, "slave0")
		switch {
		case err == nil && strings.Contains(slave0, "state=online") && ackedAtLeast(slave0, written):
			return nil
		case time.Now().After(deadline) || ctx.Err() != nil:
			return fmt.Errorf("not online and acknowledging after 30s: %q, %v", slave0, err)
		}
	}
}

// splitAddr splits host:port.
func splitAddr(addr string) (string, string, error) {
	host, port, ok := strings.Cut(addr, ":")
	if !ok {
		return "", "", fmt.Errorf("address %q has no port", addr)
	}
	return host, port, nil
}

// replicationField is a field of INFO replication.
func replicationField(ctx context.Context, admin *redis.Client, field string) (string, error) {
	text, err := admin.Info(ctx, "replication").Result()
	if err != nil {
		return "", err
	}
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("INFO replication has no %s", field)
}

// ackedAtLeast reports whether a line slave0, slave1, ... of INFO
// replication shows the replica's acknowledged offset at least written.
func ackedAtLeast(slave, written string) bool {
	want, err := strconv.ParseInt(written, 10, 64)
	if err != nil {
		return false
	}
	for kv := range strings.SplitSeq(slave, ",") {
		if v, ok := strings.CutPrefix(kv, "offset="); ok {
			acked, err := strconv.ParseInt(v, 10, 64)
			return err == nil && acked >= want
		}
	}
	return false
}

// replicasTableMD is the replicas table: for each workload and strategy,
// a row without the option and one with it.
func replicasTableMD(_ config, rows []replicasRow) string {
	var b strings.Builder
	b.WriteString("| strategy | goroutines | Bucket | pairs | decisions/s | vs the default | one pair's ratio | p50 | p99 | round trips / decision | client CPU / decision | Redis CPU / decision (primary) | errors |\n")
	b.WriteString("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		line := func(variant string, m measures, ratio, pairs string) {
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %s | %s | %s | %v | %v | %.2f | %s | %s | %s |\n",
				r.Impl, r.Spec.Goroutines, variant, r.Spec.Pairs, rate(m.Rate), ratio, pairs, round(m.P50), round(m.P99), m.Trips,
				micros(m.ClientCPU), micros(m.ServerCPU), errorsCell(m.Errors, m.FirstErr))
		}
		line("default", r.Default, "", "")
		line(fmt.Sprintf("`WithReplicas(1, %v)`", replicasWait), r.Replicas,
			fmt.Sprintf("%.2fx", r.Ratio()), fmt.Sprintf("%.2f–%.2fx", r.RatioMin, r.RatioMax))
	}
	return b.String()
}

// replicasMethod says how the replicas table is measured.
func replicasMethod(_ config, rows []replicasRow) string {
	s := rows[0].Spec
	return fmt.Sprintf("What `WithReplicas` costs (see [Replication and failover](../docs/operating-redis.md#replication-and-failover)). "+
		"For this table the library's server gets a replica, a redis-server of the same version and settings on this machine (`--replicaof`), online and acknowledging before the first cell; both variants run with it attached. "+
		"Each strategy runs the distinct-clients workload (%s clients of one resource, called round-robin, each allowed %s per window, so that every call is admitted and written) in cells of %v that alternate "+
		"the default Bucket with one `WithReplicas(1, %v)`, whose every decision is followed by `WAIT 1` in its round trip and admitted once the replica acknowledged it; %d pairs, each cell on a database emptied before it. "+
		"Both Buckets have `WithScanCount(%s)`, so that Logs's SCAN of a database its logs fill stays one page: its round trips are then the decision's, 2. "+
		"One goroutine shows what a decision waits alone; 32, the rate of a resource whose concurrent calls are batched (a batch waits once for all its calls). "+
		"\"vs the default\" is the option's decisions/s over the default's, over all pairs; \"one pair's ratio\" the lowest and highest of single pairs. "+
		"CPU per decision as in the steady table; the Redis CPU is the primary's only: the replica's is not counted, though it shares this machine's two cores.",
		thousands(int64(s.Clients)), thousands(replicasLimit), s.Cell, replicasWait, s.Pairs, thousands(replicasScanCount))
}
