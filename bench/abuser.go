package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// The abuser table: two rules, one per resource and one
// per client. One client, already at its own limit, hammers the resource
// from Buckets goroutines each; a polite Bucket sends one call every Pace,
// each from a client never seen before. The resource never holds more
// than the abuser's own limit and the polite calls of one window, so every
// polite call should pass.
type abuserSpec struct {
	ResourceLimit, ClientLimit int
	Window                     time.Duration
	Buckets, Goroutines        int // the abuser's
	Pace                       time.Duration
	Polite                     int // calls, each from a fresh client
}

var (
	fullAbuser  = abuserSpec{ResourceLimit: 100, ClientLimit: 5, Window: 2 * time.Second, Buckets: 2, Goroutines: 100, Pace: 50 * time.Millisecond, Polite: 100}
	quickAbuser = abuserSpec{ResourceLimit: 100, ClientLimit: 5, Window: 2 * time.Second, Buckets: 2, Goroutines: 16, Pace: 50 * time.Millisecond, Polite: 20}
)

// abuserResource is the resource of the case; the abuser is the load's
// one client, "hot".
const abuserResource = "api"

// abuserRow is one implementation in the abuser case.
type abuserRow struct {
	Impl string
	How  string // the rules as the implementation has them
	Spec abuserSpec
	// The abuser's calls during the polite ones, their round trips (of
	// its Buckets' clients only) and admissions (besides the ones that
	// filled its limit first).
	AbuserCalls, AbuserAdmitted int64
	AbuserTrips                 float64 // per call
	AbuserRate                  float64 // calls/s
	Admitted, Errors            int64   // the polite calls'
	FirstErr                    string
	P50, P99                    time.Duration // the polite calls'
	Check                       string
	Violation                   bool
}

// twoRules makes an implementation's limiter with both rules of spec.
type twoRules struct {
	name, how string
	ours      bool
	scripting bool
	bound     func(limit int, window, elapsed time.Duration) int64 // as impl's
	make      func(rdb *redis.Client, spec abuserSpec) (limiter, error)
}

// implName is its name, for -impl.
func (im twoRules) implName() string { return im.name }

// abuserImpls are this library's strategies with both rules, and the
// peers' natural equivalent: they have one rule per limiter, so two
// limiters, the client's checked first and the resource's only for a call
// the client's admitted (a call the resource's then denies has used the
// client's room: not all or nothing).
func abuserImpls() []twoRules {
	var out []twoRules
	for _, s := range strategies {
		opts := s.opts
		out = append(out, twoRules{name: s.name, ours: true, bound: strategyBound(s.bucket), how: "PerResource + PerClient, all or nothing",
			make: func(rdb *redis.Client, spec abuserSpec) (limiter, error) {
				b, err := leakybucket.New(rdb, append([]leakybucket.Option{leakybucket.WithPrefix("lb"),
					leakybucket.PerResource(leakybucket.Per(spec.ResourceLimit, spec.Window)),
					leakybucket.PerClient(leakybucket.Per(spec.ClientLimit, spec.Window))}, opts...)...)
				return libLimiter{b}, err
			}})
	}
	return append(out,
		twoRules{name: redisRateName, scripting: true, bound: gcraBound, how: "two limiters: the client's key, then the resource's",
			make: func(rdb *redis.Client, spec abuserSpec) (limiter, error) {
				l := redis_rate.NewLimiter(rdb)
				per := func(n int) redis_rate.Limit { return redis_rate.Limit{Rate: n, Burst: n, Period: spec.Window} }
				return clientThenResource{rateLimiter{l, per(spec.ClientLimit)}, rateLimiter{l, per(spec.ResourceLimit)}}, nil
			}},
		twoRules{name: ululeName, scripting: true, bound: windowBound, how: "two limiters: the client's key, then the resource's",
			make: func(rdb *redis.Client, spec abuserSpec) (limiter, error) {
				store, err := ululeredis.NewStoreWithOptions(rdb, ulule.StoreOptions{Prefix: "ulule"})
				per := func(n int) ululeLimiter {
					return ululeLimiter{ulule.New(store, ulule.Rate{Period: spec.Window, Limit: int64(n)})}
				}
				return clientThenResource{per(spec.ClientLimit), per(spec.ResourceLimit)}, err
			}},
	)
}

// clientThenResource is two single-rule limiters as their users combine
// them: the client's key first, then the resource's (one key for every
// client), only for a call the first admitted.
type clientThenResource struct{ client, resource limiter }

func (c clientThenResource) Allow(ctx context.Context, resource, client string) (bool, error) {
	ok, err := c.client.Allow(ctx, resource, client)
	if !ok || err != nil {
		return false, err
	}
	return c.resource.Allow(ctx, resource, "*")
}

// abuserTable is the abuser table: its measurement and its report, below.
var abuserTable = tableOf("abuser", "Abuser", func(res *results) *[]abuserRow { return &res.abuser }, report[abuserRow]{
	measure:  each(abuserImpls, (*runner).abuser, abuserLog),
	markdown: abuserTableMD, title: "A client past its own limit beside polite ones", method: abuserMethod, targets: abuserTargets,
	checked: "abuser", check: func(r abuserRow) (string, string, bool) { return r.Impl, r.Check, r.Violation },
})

// abuser runs the case on one implementation: its abuser Buckets and the
// polite one each on a client of their own, the abuser's round trips
// counted apart.
func (r *runner) abuser(ctx context.Context, im twoRules) (abuserRow, error) {
	spec, s := r.cfg.abuser, r.lib
	if im.scripting {
		s = r.peers
	}
	abuserTrips := &trips{}
	var clients []*redis.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	newLim := func(t *trips, goroutines int) (limiter, error) {
		c := s.srv.client(poolSize)
		c.AddHook(t)
		clients = append(clients, c)
		if err := warmPool(ctx, c, goroutines); err != nil {
			return nil, err
		}
		return im.make(c, spec)
	}
	var lims []limiter
	for range spec.Buckets {
		lim, err := newLim(abuserTrips, spec.Goroutines)
		if err != nil {
			return abuserRow{}, err
		}
		lims = append(lims, lim)
	}
	polite, err := newLim(&trips{}, 1)
	if err != nil {
		return abuserRow{}, err
	}
	if err := s.empty(ctx); err != nil {
		return abuserRow{}, err
	}
	if err := fillClient(ctx, lims[0], spec); err != nil {
		return abuserRow{}, err
	}
	return r.abuse(ctx, im, lims, polite, abuserTrips)
}

// abuserLog is the line the run logs of a row.
func abuserLog(a abuserRow) string {
	return fmt.Sprintf("abuser %-33s polite admitted %d of %d, abuser %.3f round trips per call (%d calls, %d admitted); %s",
		a.Impl, a.Admitted, a.Spec.Polite, a.AbuserTrips, a.AbuserCalls, a.AbuserAdmitted, a.Check)
}

// fillClient makes the abuser's calls that its own limit admits.
func fillClient(ctx context.Context, lim limiter, spec abuserSpec) error {
	for i := range spec.ClientLimit {
		ok, err := lim.Allow(ctx, abuserResource, workload{Keys: 1}.client(0))
		if err != nil || !ok {
			return fmt.Errorf("the abuser's call %d of its limit %d: allowed %v, %v", i+1, spec.ClientLimit, ok, err)
		}
	}
	return nil
}

// abuse runs the abuser's Buckets while the polite calls are made, and
// stops them when those are done.
func (r *runner) abuse(ctx context.Context, im twoRules, lims []limiter, polite limiter, tr *trips) (abuserRow, error) {
	spec := r.cfg.abuser
	span := time.Duration(spec.Polite) * spec.Pace
	w := workload{Name: "abuser", Resource: abuserResource, Keys: 1, Goroutines: spec.Buckets * spec.Goroutines}
	var hammer loadResult
	var wg sync.WaitGroup
	wg.Go(func() {
		hammer = load{w: w, lims: lims, tr: tr, d: span, timeout: r.cfg.timeout}.run(ctx)
	})
	var calls pacedResult
	first := time.Now()
	for i := range spec.Polite {
		time.Sleep(time.Until(first.Add(time.Duration(i) * spec.Pace)))
		s := time.Now()
		ok, err := allowWithin(ctx, polite, r.cfg.timeout, abuserResource, "polite-"+strconv.Itoa(i))
		calls.lat = append(calls.lat, int64(time.Since(s)))
		calls.note(ok, err, false)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return abuserRow{}, err
	}
	out := abuserRow{Impl: im.name, How: im.how, Spec: spec, AbuserCalls: hammer.Decisions, AbuserAdmitted: hammer.Admitted[0],
		AbuserTrips: float64(hammer.Trips) / float64(max(hammer.Decisions, 1)), AbuserRate: float64(hammer.Decisions) / hammer.Elapsed.Seconds(),
		Admitted: calls.admitted, Errors: calls.errs + hammer.Errors, FirstErr: calls.firstErr + hammer.FirstErr}
	lat := sortedDurations(calls.lat)
	out.P50, out.P99 = percentile(lat, 50), percentile(lat, 99)
	out.check(im.bound, hammer.Elapsed)
	return out, nil
}

// check compares the abuser's admissions with its own limit: the calls
// that filled it were in the first window.
func (a *abuserRow) check(bound func(int, time.Duration, time.Duration) int64, elapsed time.Duration) {
	more := bound(a.Spec.ClientLimit, a.Spec.Window, elapsed) - int64(a.Spec.ClientLimit)
	if a.AbuserAdmitted > more {
		a.Violation = true
		a.Check = fmt.Sprintf("OVER-ADMITTED: the abuser got %d more in %v, more than %d", a.AbuserAdmitted, elapsed.Round(time.Millisecond), more)
		return
	}
	a.Check = "ok"
}

// abuserTableMD is the abuser table.
func abuserTableMD(_ config, rows []abuserRow) string {
	return markdownTable("| implementation | rules | polite admitted | polite p50 | polite p99 | abuser calls | abuser calls/s | abuser round trips / call | abuser admitted | errors | check |\n"+
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n", rows, func(a abuserRow) string {
		return fmt.Sprintf("| %s | %s | %d of %d | %v | %v | %s | %s | %.3f | %d | %s | %s |\n",
			a.Impl, a.How, a.Admitted, a.Spec.Polite, round(a.P50), round(a.P99), thousands(a.AbuserCalls), rate(a.AbuserRate),
			a.AbuserTrips, a.AbuserAdmitted, errorsCell(a.Errors, a.FirstErr), a.Check)
	})
}

// abuserMethod says how the abuser table is measured.
func abuserMethod(_ config, rows []abuserRow) string {
	a := rows[0].Spec
	method := fmt.Sprintf("A client at its own limit, under `PerResource(Per(%d, %v))` + `PerClient(Per(%d, %v))`. One client first makes the %d calls its own limit admits, then calls flat out from %d Buckets x %d goroutines, each Bucket on a go-redis client of its own; "+
		"meanwhile a third Bucket sends one call every %v, each from a client never seen before, %d calls. The resource never holds more than the abuser's %d and the polite calls of one window (%d), so every polite call should pass. "+
		"The abuser's round trips are counted on its Buckets' clients only, per call it made while the polite calls ran; its admissions after the first %d are checked against its limit. "+
		"redis_rate and ulule/limiter have one rule per limiter: they run their natural equivalent, two limiters, the client's key checked first and the resource's (one key for every client) only for a call the client's admitted; a call the resource's then denies has used its client's room, which this library's all-or-nothing rules do not do.",
		a.ResourceLimit, a.Window, a.ClientLimit, a.Window, a.ClientLimit, a.Buckets, a.Goroutines, a.Pace, a.Polite, a.ClientLimit,
		int(a.Window/a.Pace), a.ClientLimit)
	return method
}

// abuserTargets: beside a client past its own limit, >= 95% of
// the polite calls admitted, for this library's strategies.
func abuserTargets(_ config, rows []abuserRow) []target {
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
