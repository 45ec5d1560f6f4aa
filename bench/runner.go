package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"

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
	contention []contentionSpec
	replicas   []replicasSpec
	costLimits []int  // of the SortedSet cost table
	out        string // where BENCHMARKS.md and the PNG go; "" for nowhere
	command    string // the command line, for the report
	quick      bool
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

// results is what one run measured, table by table, in the order they run.
type results struct {
	rows       []row // the throughput table
	steady     []steadyRow
	hammer     []hammerRow
	noisy      []noisyRow
	abuser     []abuserRow
	procs      []procsRow
	cost       []costRow // SortedSet's cost by limit
	memory     []memoryRow
	inProcess  []inProcessRow  // NewLocal
	inflight   []inflightRow   // package inflight's acquisitions and releases
	contention []contentionRow // the same under short waits from several clients
	replicas   []replicasRow   // WithReplicas beside the default
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

// each is the measurement of a table with one row per implementation:
// measure each of items that -impl selects, in order, and log a line of
// each.
func each[I interface{ implName() string }, R any](items func() []I, measure func(*runner, context.Context, I) (R, error), line func(R) string) func(*runner, context.Context) ([]R, error) {
	return func(r *runner, ctx context.Context) ([]R, error) {
		var out []R
		for _, it := range items() {
			if !r.cfg.impl.MatchString(it.implName()) {
				continue
			}
			t0 := time.Now()
			got, err := measure(r, ctx, it)
			if err != nil {
				return out, fmt.Errorf("%s: %w", it.implName(), err)
			}
			fmt.Fprintf(r.log, "bench: %s (%.1fs)\n", line(got), time.Since(t0).Seconds())
			out = append(out, got)
		}
		return out, nil
	}
}
