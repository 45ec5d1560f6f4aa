package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// The limits of the SortedSet cost table, per window (a minute).
var (
	fullCostLimits  = []int{10, 100, 1_000, 10_000, 100_000, 1_000_000}
	quickCostLimits = []int{10, 1_000, 10_000}
)

// costRow is SortedSet with one key whose window holds as many calls as
// its limit allows.
type costRow struct {
	Limit   int
	Members int64 // in the key's set, before and after the cell
	Fill    time.Duration
	measures
	Check string
}

// costResource and costClient are the one key of the table.
const (
	costResource = "cost"
	costClient   = "hot"
)

// costTable is the SortedSet cost table: its measurement and its report, below.
var costTable = tableOf("sortedset", "SortedSet cost", func(res *results) *[]costRow { return &res.cost }, report[costRow]{
	measure:  (*runner).costAll,
	markdown: costTableMD, title: "SortedSet cost", method: costMethod, prose: costProse,
})

// costAll measures SortedSet at each limit of the table.
func (r *runner) costAll(ctx context.Context) ([]costRow, error) {
	var out []costRow
	ims := r.impls(func(im impl) bool { return im.name == sortedSetName })
	if len(ims) == 0 {
		return out, nil
	}
	for _, limit := range r.cfg.costLimits {
		t0 := time.Now()
		c, err := r.cost(ctx, limit)
		if err != nil {
			return nil, fmt.Errorf("limit %d: %w", limit, err)
		}
		fmt.Fprintf(r.log, "bench: SortedSet at limit %9d/%s, %9d members: %10.1f/s  p50 %-9v p99 %-9v %5.2f trips  %d errors  %s (%.1fs)\n",
			limit, shortDur(r.cfg.window), c.Members, c.Rate, round(c.P50), round(c.P99), c.Trips, c.Errors, c.Check, time.Since(t0).Seconds())
		out = append(out, c)
	}
	return out, nil
}

// costWeight is the weight of the table's calls: the denial cache answers
// calls of weight 1 only, so each of these is decided by Redis.
const costWeight = 2

// cost fills one key's window to the limit, then measures one goroutine
// calling it with calls of weight costWeight for a cell: every call is
// denied and records nothing, so each decision reads the same full window.
func (r *runner) cost(ctx context.Context, limit int) (costRow, error) {
	s := r.lib
	b, err := newBucket(s.client, limit, r.cfg.window, leakybucket.WithStrategy(leakybucket.SortedSet))
	if err != nil {
		return costRow{}, err
	}
	if err := s.empty(ctx); err != nil {
		return costRow{}, err
	}
	t0 := time.Now()
	key, err := fill(ctx, s.admin, b, limit)
	if err != nil {
		return costRow{}, fmt.Errorf("filling the window: %w", err)
	}
	out := costRow{Limit: limit, Members: int64(limit), Fill: time.Since(t0)}
	w := workload{Name: "cost", Resource: costResource, Keys: 1, Goroutines: 1}
	got := load{w: w, lims: []limiter{libLimiter{b}}, tr: s.trips, d: r.cfg.cell, timeout: r.cfg.timeout, weights: []int{costWeight}}.run(ctx)
	if err := ctx.Err(); err != nil {
		return costRow{}, err
	}
	out.measures = measure(got)
	n, err := s.admin.ZCard(ctx, key).Result()
	if err != nil {
		return costRow{}, err
	}
	if got.Admitted[0] > 0 || n != int64(limit) {
		return costRow{}, fmt.Errorf("the window did not stay full: %d calls admitted, %d members at the end", got.Admitted[0], n)
	}
	// One goroutine, so no batching: each decision that Redis made is one
	// round trip; fewer would mean some were answered in process.
	if out.Trips < 0.99 {
		return costRow{}, fmt.Errorf("%.2f round trips per decision: some calls were answered without Redis", out.Trips)
	}
	out.Check = "ok, full throughout, every call decided by Redis"
	return out, nil
}

// fill makes the key's window hold limit calls, and returns its set. One
// call through the Bucket writes the set and shows its member; the other
// limit-1 are copies of that member under other ids, with its score,
// written by ZADD (calling limit times would take minutes at 1 000 000).
// Peek, through the Bucket, must then count all limit of them.
func fill(ctx context.Context, admin *redis.Client, b *leakybucket.Bucket, limit int) (string, error) {
	res, err := b.Allow(ctx, costResource, costClient)
	if err != nil || !res.Allowed {
		return "", fmt.Errorf("the first call: allowed %v, %v", res.Allowed, err)
	}
	key, member, err := onlyMember(ctx, admin)
	if err != nil {
		return "", err
	}
	if err := addCopies(ctx, admin, key, member, limit-1); err != nil {
		return "", err
	}
	peek, err := b.Peek(ctx, costResource, costClient)
	if err != nil {
		return "", fmt.Errorf("Peek: %w", err)
	}
	if peek.Allowed || len(peek.Rules) != 1 || peek.Rules[0].Used != limit {
		return "", fmt.Errorf("Peek does not count the %d calls written: allowed %v, rules %+v", limit, peek.Allowed, peek.Rules)
	}
	return key, nil
}

// onlyMember finds the one sorted set of the database and its one member.
func onlyMember(ctx context.Context, admin *redis.Client) (string, redis.Z, error) {
	keys, err := admin.Keys(ctx, "*").Result()
	if err != nil {
		return "", redis.Z{}, err
	}
	var sets []string
	for _, k := range keys {
		if t, err := admin.Type(ctx, k).Result(); err != nil {
			return "", redis.Z{}, err
		} else if t == "zset" {
			sets = append(sets, k)
		}
	}
	if len(sets) != 1 {
		return "", redis.Z{}, fmt.Errorf("one call wrote %d sorted sets (%q), want 1", len(sets), sets)
	}
	zs, err := admin.ZRangeWithScores(ctx, sets[0], 0, -1).Result()
	if err != nil {
		return "", redis.Z{}, err
	}
	if len(zs) != 1 {
		return "", redis.Z{}, fmt.Errorf("one call wrote %d members, want 1", len(zs))
	}
	return sets[0], zs[0], nil
}

// addCopies adds n copies of z to key, in pipelined batches. A copy keeps
// the member's client prefix (up to its last ':', if any: a per-resource
// set's members start with their client's, for Flush) and has another id
// of the same length in place of the call's, so the set holds what n
// calls would.
func addCopies(ctx context.Context, admin *redis.Client, key string, z redis.Z, n int) error {
	m, ok := z.Member.(string)
	if !ok || m == "" {
		return fmt.Errorf("the member %v is not a string", z.Member)
	}
	prefix := m[:strings.LastIndexByte(m, ':')+1]
	idLen := len(m) - len(prefix)
	const batch = 10_000
	for done := 0; done < n; done += batch {
		zs := make([]redis.Z, 0, min(batch, n-done))
		for j := done; j < min(done+batch, n); j++ {
			zs = append(zs, redis.Z{Score: z.Score, Member: prefix + fmt.Sprintf("~%0*d", idLen-1, j)})
		}
		if err := admin.ZAdd(ctx, key, zs...).Err(); err != nil {
			return err
		}
	}
	return nil
}

// costTableMD is the SortedSet cost table.
func costTableMD(cfg config, rows []costRow) string {
	window := cfg.window
	var b strings.Builder
	fmt.Fprintf(&b, "| limit | calls in the window | decisions | decisions/s | slower than at %s | p50 | p99 | round trips / decision | errors | check |\n",
		thousands(int64(rows[0].Limit)))
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, c := range rows {
		fmt.Fprintf(&b, "| %s/%s | %s | %s | %s | %s | %v | %v | %.2f | %s | %s |\n",
			thousands(int64(c.Limit)), shortDur(window), thousands(c.Members), thousands(c.Decisions), rate(c.Rate), slower(rows[0].Rate, c.Rate),
			round(c.P50), round(c.P99), c.Trips, errorsCell(c.Errors, c.FirstErr), c.Check)
	}
	return b.String()
}

// costMethod says how the SortedSet cost table is measured.
func costMethod(cfg config, rows []costRow) string {
	return fmt.Sprintf("What a SortedSet decision costs when its key's window holds as many calls as the limit allows, at limits %s per %s. "+
		"For each limit, one call through the Bucket writes the key's set; the other limit - 1 calls are copies of its member under other ids, with its score, added by ZADD (calling the Bucket a million times would take minutes), and Bucket.Peek must then count exactly the limit. "+
		"One goroutine then calls the key for %v with calls of weight %d: the denial cache answers only calls of weight 1 (a run of them would be answered in this process, at no round trip), so every one of these goes to Redis, one round trip each (checked: at least 0.99 per decision). "+
		"This Bucket has seen the set full, so foresight sends each call to look, as it does every denied call after the first: one MULTI/EXEC that trims the window (ZREMRANGEBYSCORE), counts it (ZCARD), reads its oldest members and its newest (ZRANGE), writing no member and extending nothing; the first call that found the set full unseen (not measured here) also adds its members, and takes them back in a second transaction. "+
		"Every call is denied, and the set must still hold the limit at the end. "+
		"Few decisions fit in the cell at the largest limits, so their p50 and p99 rest on few samples (see the decisions column).",
		costLimitsList(rows), windowName(cfg.window), cfg.cell, costWeight)
}

func costLimitsList(rows []costRow) string {
	var s []string
	for _, c := range rows {
		s = append(s, thousands(int64(c.Limit)))
	}
	return strings.Join(s, ", ")
}

// slower is how many times fewer decisions/s than base rate x is: "96x".
func slower(base, x float64) string {
	if x <= 0 || base <= 0 {
		return "–"
	}
	return rate(base/x) + "x"
}

func costProse(b *strings.Builder, cfg config, rows []costRow) {
	first, last := rows[0], rows[len(rows)-1]
	fmt.Fprintf(b, "- **SortedSet's cost against its limit**: a decision trims, counts (ZCARD), reads the newest member (and the oldest, unless this process saw a tenth of the limit to spare) and, if this process saw room, adds the call, each O(log n) in the set, which holds the calls admitted in the window. "+
		"With the window full, one decision of weight 2 (a look: no member written, the denial cache not asked) takes %v (p50) at a limit of %s/%s and %v at %s/%s: %s decisions/s against %s (%s slower), at %.2f round trips",
		round(first.P50), thousands(int64(first.Limit)), shortDur(cfg.window), round(last.P50), thousands(int64(last.Limit)), shortDur(cfg.window),
		rate(last.Rate), rate(first.Rate), slower(first.Rate, last.Rate), last.Trips)
	if last.Errors > 0 {
		fmt.Fprintf(b, "; %d of the %d decisions at %s/%s failed (%s)", last.Errors, last.Decisions, thousands(int64(last.Limit)), shortDur(cfg.window), last.FirstErr)
	}
	b.WriteString(".\n")
}
