package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// config is what one invocation measures.
type config struct {
	cell       time.Duration // time box of one cell: no call starts after it
	timeout    time.Duration // the longest one call may take
	window     time.Duration
	limits     []int
	workloads  []workload
	impl       *regexp.Regexp // which implementations to run
	tables     *regexp.Regexp // which tables to measure
	hammer     hammerSpec
	noisy      noisySpec
	abuser     abuserSpec
	procs      procsSpec
	steady     []steadySpec
	memory     memorySpec
	inflight   []inflightSpec
	replicas   []replicasSpec
	costLimits []int  // of the SortedSet cost table
	out        string // where BENCHMARKS.md and the PNG go; "" for nowhere
	command    string // the command line, for the report
	quick      bool
}

// The limits of the throughput table, per window (a minute): one a decision
// reads little for, and one no workload reaches in a cell, so that every
// call is admitted and a decision reads all the window has counted.
var throughputLimits = []int{10, 1_000_000}

// fullWorkloads are issue 11's: many keys with one caller each, and one
// key with many callers.
func fullWorkloads() []workload {
	return []workload{
		{Name: "10 000 distinct keys, 32 goroutines", Resource: "distinct", Keys: 10_000, Goroutines: 32},
		{Name: "hot key, 64 goroutines", Resource: "hot", Keys: 1, Goroutines: 64},
	}
}

// quickWorkloads have the shapes of the full ones, smaller.
func quickWorkloads() []workload {
	return []workload{
		{Name: "1 000 distinct keys, 8 goroutines", Resource: "distinct", Keys: 1_000, Goroutines: 8},
		{Name: "hot key, 16 goroutines", Resource: "hot", Keys: 1, Goroutines: 16},
	}
}

// measures are what every table reports of a cell's calls.
type measures struct {
	Decisions int64
	Rate      float64 // decisions/s
	P50, P99  time.Duration
	Trips     float64 // per decision
	Errors    int64
	FirstErr  string
	// CPU time per decision, in µs, where the cell measured it (else
	// -1): the bench process's and the server's.
	ClientCPU, ServerCPU float64
}

// measure computes a cell's measures from what its load returned.
func measure(got loadResult) measures {
	lat := sortedDurations(got.Latencies)
	m := measures{
		Decisions: got.Decisions, Errors: got.Errors, FirstErr: got.FirstErr,
		Rate: float64(got.Decisions) / got.Elapsed.Seconds(),
		P50:  percentile(lat, 50), P99: percentile(lat, 99),
		Trips:     float64(got.Trips) / float64(max(got.Decisions, 1)),
		ClientCPU: perDecision(got.CPU.Client, got.Decisions),
		ServerCPU: perDecision(got.CPU.Server, got.Decisions),
	}
	if !got.measured {
		m.ClientCPU, m.ServerCPU = -1, -1
	}
	return m
}

// row is one cell: a workload, a limit, an implementation.
type row struct {
	Workload workload
	Limit    int
	Impl     string
	measures

	MaxAdmitted   int64 // the most any key got
	Bound         int64 // the most any key may get; 0 for the floor
	TotalAdmitted int64
	Check         string // what the verification found
	Violation     bool   // a key got more than the limit allows
}

// A side is one of the two servers, with the clients the cells use.
type side struct {
	srv    *server
	admin  *redis.Client // empties the database between cells
	client *redis.Client // the limiters'
	trips  *trips        // counts the round trips of client and of more()
	meter  cpuMeter      // the CPU time of its cells
}

const poolSize = 128

func newSide(srv *server) *side {
	s := &side{srv: srv, admin: srv.client(4), trips: &trips{}}
	s.client = s.more()
	s.meter.admin = s.admin
	return s
}

// more returns another client of the server, its round trips counted with
// the side's: a process of its own, as far as Redis can tell.
func (s *side) more() *redis.Client {
	c := s.srv.client(poolSize)
	c.AddHook(s.trips)
	return c
}

func (s *side) close() {
	s.admin.Close()
	s.client.Close()
}

// empty deletes every key, and checks that none is left.
func (s *side) empty(ctx context.Context) error {
	if err := s.admin.FlushDB(ctx).Err(); err != nil {
		return err
	}
	n, err := s.admin.DBSize(ctx).Result()
	if err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("the database holds %d keys after FLUSHDB, want none", n)
	}
	return nil
}

// runner holds both sides: lib, the scripting-denied server of this
// library and the floor; peers, the server of the Lua limiters.
type runner struct {
	cfg        config
	lib, peers *side
	log        io.Writer
}

func newRunner(cfg config, lib, peers *server, log io.Writer) *runner {
	return &runner{cfg: cfg, lib: newSide(lib), peers: newSide(peers), log: log}
}

func (r *runner) close() {
	r.lib.close()
	r.peers.close()
}

// sideOf is the side impl runs on.
func (r *runner) sideOf(im impl) *side {
	if im.scripting {
		return r.peers
	}
	return r.lib
}

// results is what one run measured, table by table.
type results struct {
	rows   []row // the throughput table
	hammer []hammerRow
	noisy  []noisyRow
	cost   []costRow
	// inProcess is issue 13's table: NewLocal.
	inProcess []inProcessRow
	// Issue 19's: a client past its own limit beside polite ones, and
	// processes on one key; the distinct-clients workload in a steady
	// state. Issue 20's: Redis memory per client, and how long it stays.
	abuser []abuserRow
	procs  []procsRow
	steady []steadyRow
	memory []memoryRow
	// Package inflight's acquisitions and releases.
	inflight []inflightRow
	// WithReplicas beside the default.
	replicas []replicasRow
}

// Names of the tables, for -table.
const (
	throughputTable = "throughput"
	hammerTable     = "hammer"
	noisyTable      = "neighbour"
	costTable       = "sortedset"
	inProcessTable  = "inprocess"
	abuserTable     = "abuser"
	procsTable      = "processes"
	steadyTable     = "steady"
	memoryTable     = "memory"
	inflightTable   = "inflight"
	replicasTable   = "replicas"
)

var tableNames = []string{throughputTable, steadyTable, hammerTable, noisyTable, abuserTable, procsTable, costTable, memoryTable, inProcessTable, inflightTable, replicasTable}

// run measures every table that -table selects, in order.
func (r *runner) run(ctx context.Context) (results, error) {
	var res results
	steps := []struct {
		name string
		run  func(context.Context, *results) error
	}{
		{throughputTable, r.throughput},
		{steadyTable, r.steadyAll},
		{hammerTable, r.hammerAll},
		{noisyTable, r.noisyAll},
		{abuserTable, r.abuserAll},
		{procsTable, r.procsAll},
		{costTable, r.costAll},
		{memoryTable, r.memoryAll},
		{inProcessTable, r.inProcessAll},
		{inflightTable, r.inflightAll},
		{replicasTable, r.replicasAll}, // last: its replica stays attached to the library's server until it ends
	}
	for _, s := range steps {
		if !r.cfg.tables.MatchString(s.name) {
			continue
		}
		if err := s.run(ctx, &res); err != nil {
			return res, fmt.Errorf("%s table: %w", s.name, err)
		}
	}
	return res, nil
}

// impls are the implementations that -impl selects and keep keeps.
func (r *runner) impls(keep func(impl) bool) []impl {
	return filter(implementations(), func(im impl) bool { return r.cfg.impl.MatchString(im.name) && keep(im) })
}

func all(impl) bool       { return true }
func ours(im impl) bool   { return im.ours }
func limits(im impl) bool { return im.bound != nil }

// warmPool opens n connections in the client's pool, so that no cell pays
// for dialling.
func warmPool(ctx context.Context, rdb *redis.Client, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = rdb.Ping(ctx).Err() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// prepare makes im's limiter on s's client, warms the pool for goroutines
// callers and the limiter with one call (which loads the Lua scripts into
// the server's cache), and then empties the database.
func prepare(ctx context.Context, s *side, im impl, limit int, window time.Duration, goroutines int) (limiter, error) {
	lim, err := im.make(s.client, limit, window)
	if err != nil {
		return nil, err
	}
	if err := warmPool(ctx, s.client, goroutines); err != nil {
		return nil, err
	}
	if _, err := lim.Allow(ctx, "warmup", "warmup"); err != nil {
		return nil, fmt.Errorf("warm-up call: %w", err)
	}
	return lim, s.empty(ctx)
}

// checkSent checks that a decision was made, and that nothing was sent to
// the scripting-denied server that it would refuse.
func checkSent(im impl, res loadResult) error {
	if res.cpuErr != nil {
		return res.cpuErr
	}
	if res.Decisions == 0 {
		return errors.New("no decision was made")
	}
	if !im.scripting && res.Scripts > 0 {
		return fmt.Errorf("%d script commands were sent to the scripting-denied server", res.Scripts)
	}
	return nil
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

func shortDur(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	}
	return d.String()
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ' ')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
