package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The memory table: Clients clients of one resource make Calls
// calls each under PerClient(Per(Limit, Window)); then what Redis holds
// per client (used_memory before and after, over Clients), the keys' PTTL,
// and when, on the real clock, the database is empty again (DBSIZE 0:
// Redis has expired every key), checked every Poll up to Bound after the
// last call. Each implementation writes to a logical database of its own,
// so that the waits overlap and one DBSIZE counts one implementation.
type memorySpec struct {
	Clients, Calls, Limit, Goroutines int
	Window, Bound, Poll               time.Duration
}

var (
	fullMemory  = memorySpec{Clients: 2_000, Calls: 3, Limit: 10, Goroutines: 16, Window: 10 * time.Second, Bound: 40 * time.Second, Poll: 100 * time.Millisecond}
	quickMemory = memorySpec{Clients: 200, Calls: 3, Limit: 10, Goroutines: 8, Window: time.Second, Bound: 3 * time.Second, Poll: 50 * time.Millisecond}
)

// memoryRow is one implementation's memory.
type memoryRow struct {
	Impl      string
	Spec      memorySpec
	Keys      int64 // after the calls
	Bytes     int64 // used_memory after less before
	Usage     int64 // the keys' MEMORY USAGE, summed
	NoTTL     int64 // keys without an expiry
	MinTTL    time.Duration
	MaxTTL    time.Duration
	Gone      time.Duration // from the last call's reply to DBSIZE 0
	Left      int64         // keys still there at Bound, if any
	Errors    int64
	FirstErr  string
	db        int
	client    *redis.Client
	lastReply time.Time
}

// perClient is Bytes over the clients.
func (m memoryRow) perClient() float64 { return float64(m.Bytes) / float64(m.Spec.Clients) }

// usagePerClient is Usage over the clients.
func (m memoryRow) usagePerClient() float64 { return float64(m.Usage) / float64(m.Spec.Clients) }

// memoryTable is the memory table: its measurement and its report, below.
var memoryTable = tableOf("memory", "Memory", func(res *results) *[]memoryRow { return &res.memory }, report[memoryRow]{
	measure:  (*runner).memoryAll,
	markdown: memoryTableMD, title: "Redis memory per limited client, and how long it stays", method: memoryMethod,
	targets: memoryTargets,
})

// memoryTargets: GCRA keeps one number per client, as redis_rate does, so
// its MEMORY USAGE per client is at most 1.1x redis_rate's.
func memoryTargets(_ config, rows []memoryRow) []target {
	var ours, peer *memoryRow
	for i := range rows {
		switch rows[i].Impl {
		case gcraName:
			ours = &rows[i]
		case redisRateName:
			peer = &rows[i]
		}
	}
	if ours == nil || peer == nil {
		return nil
	}
	where := fmt.Sprintf("%s clients, %d calls each", thousands(int64(ours.Spec.Clients)), ours.Spec.Calls)
	return []target{ratioTarget("MEMORY USAGE / client <= 1.1x redis_rate's", gcraName, where,
		ours.usagePerClient()/peer.usagePerClient(), 1.1, false,
		fmt.Sprintf("%.0f vs %.0f B", ours.usagePerClient(), peer.usagePerClient()))}
}

// memoryAll fills each implementation's database, then waits for them to
// empty.
func (r *runner) memoryAll(ctx context.Context) ([]memoryRow, error) {
	var out []memoryRow
	spec := r.cfg.memory
	var rows []*memoryRow
	defer func() {
		for _, m := range rows {
			m.client.Close()
		}
	}()
	for i, im := range filter(memoryImpls(), func(im impl) bool { return r.cfg.impl.MatchString(im.name) }) {
		m := &memoryRow{Impl: im.name, Spec: spec, db: 1 + i}
		rows = append(rows, m)
		if err := r.fillMemory(ctx, im, m); err != nil {
			return nil, fmt.Errorf("%s: %w", im.name, err)
		}
	}
	if err := awaitEmpty(ctx, rows, spec); err != nil {
		return nil, err
	}
	for _, m := range rows {
		fmt.Fprintf(r.log, "bench: memory %-33s %d keys, %.0f bytes per client, PTTL %v–%v, empty %v after the last call (%d left)\n",
			m.Impl, m.Keys, m.perClient(), m.MinTTL, m.MaxTTL, m.Gone.Round(10*time.Millisecond), m.Left)
		out = append(out, *m)
	}
	return out, nil
}

// fillMemory makes im's calls in its database and measures what they
// left.
func (r *runner) fillMemory(ctx context.Context, im impl, m *memoryRow) error {
	spec, s := m.Spec, r.sideOf(im)
	m.client = s.srv.clientDB(poolSize, m.db)
	if err := warmPool(ctx, m.client, spec.Goroutines); err != nil {
		return err
	}
	lim, err := im.make(m.client, spec.Limit, spec.Window)
	if err != nil {
		return err
	}
	if _, err := lim.Allow(ctx, "warmup", "warmup"); err != nil {
		return fmt.Errorf("warm-up call: %w", err)
	}
	if err := m.client.FlushDB(ctx).Err(); err != nil {
		return err
	}
	before, err := usedMemory(ctx, s.admin)
	if err != nil {
		return err
	}
	m.calls(ctx, lim, r.cfg.timeout)
	after, err := usedMemory(ctx, s.admin)
	if err != nil {
		return err
	}
	m.Bytes = after - before
	return m.readTTLs(ctx)
}

// calls makes every client's calls, from Goroutines goroutines.
func (m *memoryRow) calls(ctx context.Context, lim limiter, timeout time.Duration) {
	var next, errs atomic.Int64
	var first sync.Once
	var wg sync.WaitGroup
	total := int64(m.Spec.Clients * m.Spec.Calls)
	for range m.Spec.Goroutines {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < total; i = next.Add(1) - 1 {
				client := "client-" + strconv.FormatInt(i%int64(m.Spec.Clients), 10)
				if _, err := allowWithin(ctx, lim, timeout, "memory", client); err != nil {
					errs.Add(1)
					first.Do(func() { m.FirstErr = err.Error() })
				}
			}
		})
	}
	wg.Wait()
	m.lastReply, m.Errors = time.Now(), errs.Load()
}

// readTTLs counts the keys and reads their PTTL and MEMORY USAGE.
func (m *memoryRow) readTTLs(ctx context.Context) error {
	var keys []string
	iter := m.client.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	m.Keys = int64(len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	usages := make([]*redis.IntCmd, len(keys))
	if _, err := m.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			ttls[i], usages[i] = p.PTTL(ctx, k), p.MemoryUsage(ctx, k)
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for _, u := range usages {
		m.Usage += u.Val() // 0 for a key gone since the SCAN
	}
	m.MinTTL = -1
	for _, c := range ttls {
		m.noteTTL(c.Val())
	}
	return nil
}

// noteTTL counts one key's PTTL into the row's span, or as a key kept
// forever.
func (m *memoryRow) noteTTL(d time.Duration) {
	switch {
	case d == -2: // expired since the SCAN: gone, not kept forever
	case d < 0:
		m.NoTTL++
	case m.MinTTL < 0:
		m.MinTTL, m.MaxTTL = d, d
	default:
		m.MinTTL, m.MaxTTL = min(m.MinTTL, d), max(m.MaxTTL, d)
	}
}

// awaitEmpty polls each database until it is empty, or Bound has passed
// since the last call of the last implementation.
func awaitEmpty(ctx context.Context, rows []*memoryRow, spec memorySpec) error {
	if len(rows) == 0 {
		return nil
	}
	deadline := rows[len(rows)-1].lastReply.Add(spec.Bound)
	for {
		waiting, err := pollEmpty(ctx, rows)
		if err != nil || waiting == 0 || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(spec.Poll):
		}
	}
}

// pollEmpty reads the DBSIZE of each database not yet seen empty, notes
// when one is, and returns how many are still waited for.
func pollEmpty(ctx context.Context, rows []*memoryRow) (int, error) {
	waiting := 0
	for _, m := range rows {
		if m.Gone > 0 {
			continue
		}
		n, err := m.client.DBSize(ctx).Result()
		if err != nil {
			return 0, err
		}
		if m.Left = n; n == 0 {
			m.Gone = time.Since(m.lastReply)
			continue
		}
		waiting++
	}
	return waiting, nil
}

// usedMemory is the server's used_memory (INFO memory), in bytes.
func usedMemory(ctx context.Context, admin *redis.Client) (int64, error) {
	info, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}

// memoryImpls are the implementations of the memory table: this library's
// strategies and the Lua peers with a limit per key.
func memoryImpls() []impl {
	return filter(implementations(), func(im impl) bool { return im.ours || im.name == redisRateName || im.name == ululeName })
}

// memoryTableMD is the memory table.
func memoryTableMD(_ config, rows []memoryRow) string {
	return markdownTable("| implementation | keys | keys / client | used_memory / client | MEMORY USAGE / client | PTTL after the calls | keys without expiry | empty (DBSIZE 0) after the last call | of which after the window | errors |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n", rows, func(m memoryRow) string {
		return fmt.Sprintf("| %s | %s | %.2f | %.0f B | %.0f B | %s | %d | %s | %s | %s |\n",
			m.Impl, thousands(m.Keys), float64(m.Keys)/float64(m.Spec.Clients), m.perClient(), m.usagePerClient(), ttlSpan(m), m.NoTTL, m.gone(), m.pastWindow(), errorsCell(m.Errors, m.FirstErr))
	})
}

func ttlSpan(m memoryRow) string {
	if m.MinTTL < 0 {
		return "–"
	}
	return fmt.Sprintf("%v–%v", m.MinTTL.Round(10*time.Millisecond), m.MaxTTL.Round(10*time.Millisecond))
}

func (m memoryRow) gone() string {
	if m.Gone == 0 {
		return fmt.Sprintf("not within %v: %s keys left", m.Spec.Bound, thousands(m.Left))
	}
	return m.Gone.Round(10 * time.Millisecond).String()
}

func (m memoryRow) pastWindow() string {
	if m.Gone == 0 {
		return fmt.Sprintf("> %v", m.Spec.Bound-m.Spec.Window)
	}
	return max(m.Gone-m.Spec.Window, 0).Round(10 * time.Millisecond).String()
}

func memoryMethod(_ config, rows []memoryRow) string {
	m := rows[0].Spec
	return fmt.Sprintf("%s clients of one resource make %d calls each (%s calls from %d goroutines, about a second or less) under `PerClient(Per(%d, %v))`, each implementation in a logical database of its own on its server (this library's, scripting denied; the peers'). "+
		"used_memory / client is the server's used_memory (INFO memory) after the calls less before them, over the clients: it includes Redis's own overhead per key, and is noisy, by tens of bytes per client from one run to the next (client buffers, the allocator). MEMORY USAGE / client sums what Redis reports for each key (MEMORY USAGE: its name, value and object overhead, not its expiry entry), read right after the calls: steadier, and what the keys themselves hold. "+
		"PTTL is read from every key right after the calls. Then each database's DBSIZE is polled every %v, on the real clock, until it is 0 (Redis has expired every key) or %v after the last call: \"after the window\" is that time less the window, how long an idle client outlives its limit in Redis. "+
		"The figures are whatever the code measured does: a change to key expiry shows here on the next run.",
		thousands(int64(m.Clients)), m.Calls, thousands(int64(m.Clients*m.Calls)), m.Goroutines, m.Limit, m.Window, m.Poll, m.Bound)
}
