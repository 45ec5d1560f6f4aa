package main

import (
	"fmt"
	"strings"
	"time"
)

// The sections of issue 19's and 20's tables.

// markdownTable is head (the header and separator lines) and one line of
// each row.
func markdownTable[T any](head string, rows []T, line func(T) string) string {
	var b strings.Builder
	b.WriteString(head)
	for _, r := range rows {
		b.WriteString(line(r))
	}
	return b.String()
}

// section writes a section: its heading, its method and its table.
func section(b *strings.Builder, heading, method, table string) {
	fmt.Fprintf(b, "## %s\n\n%s\n\n%s\n", heading, method, table)
}

// abuserTableMD is the abuser table.
func abuserTableMD(rows []abuserRow) string {
	return markdownTable("| implementation | rules | polite admitted | polite p50 | polite p99 | abuser calls | abuser calls/s | abuser round trips / call | abuser admitted | errors | check |\n"+
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n", rows, func(a abuserRow) string {
		return fmt.Sprintf("| %s | %s | %d of %d | %v | %v | %s | %s | %.3f | %d | %s | %s |\n",
			a.Impl, a.How, a.Admitted, a.Spec.Polite, round(a.P50), round(a.P99), thousands(a.AbuserCalls), rate(a.AbuserRate),
			a.AbuserTrips, a.AbuserAdmitted, errorsCell(a.Errors, a.FirstErr), a.Check)
	})
}

func abuserSection(b *strings.Builder, rows []abuserRow) {
	a := rows[0].Spec
	section(b, "A client past its own limit beside polite ones", fmt.Sprintf("A client at its own limit, under `PerResource(Per(%d, %v))` + `PerClient(Per(%d, %v))`. One client first makes the %d calls its own limit admits, then calls flat out from %d Buckets x %d goroutines, each Bucket on a go-redis client of its own; "+
		"meanwhile a third Bucket sends one call every %v, each from a client never seen before, %d calls. The resource never holds more than the abuser's %d and the polite calls of one window (%d), so every polite call should pass. "+
		"The abuser's round trips are counted on its Buckets' clients only, per call it made while the polite calls ran; its admissions after the first %d are checked against its limit. "+
		"redis_rate and ulule/limiter have one rule per limiter: they run their natural equivalent, two limiters, the client's key checked first and the resource's (one key for every client) only for a call the client's admitted; a call the resource's then denies has used its client's room, which this library's all-or-nothing rules do not do.",
		a.ResourceLimit, a.Window, a.ClientLimit, a.Window, a.ClientLimit, a.Buckets, a.Goroutines, a.Pace, a.Polite, a.ClientLimit,
		int(a.Window/a.Pace), a.ClientLimit), abuserTableMD(rows))
}

// procsTableMD is the processes table.
func procsTableMD(rows []procsRow) string {
	s := rows[0].Spec
	return markdownTable(fmt.Sprintf("| implementation | callers | decisions/s | p50 | p99 | round trips / decision | admitted (weight) | of the most possible | most in any %v | most in any %v (checked) | errors | check |\n", s.Window, s.checkSpan())+
		"|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n", rows, func(p procsRow) string {
		return fmt.Sprintf("| %s | %d processes x %d goroutines, %v | %s | %v | %v | %.3f | %d | %.1f%% | %d | %d | %s | %s |\n",
			p.Impl, p.Spec.Procs, p.Spec.Goroutines, p.Spec.Duration, rate(p.Rate), round(p.P50), round(p.P99), p.Trips,
			p.Units, p.ofMost(), p.MostInWindow, p.MostInCheck, errorsCell(p.Errors, p.FirstErr), p.Check)
	})
}

func procsSection(b *strings.Builder, rows []procsRow) {
	p := rows[0].Spec
	section(b, "Processes on one key", fmt.Sprintf("%d OS processes (this program, started %d times by the benchmark with the job in an environment variable), each with one limiter on a go-redis client of its own, call one key from %d goroutines each, weights 1, 2, 3 in turn, flat out for %v from one start time, under `PerClient(Per(%d, %v))` (redis_rate: burst = rate = %d per %v; ulule/limiter: its fixed window), on an empty database. "+
		"The most possible is %d per disjoint %v window in the %v: %d (calls under way at the end are answered after it, so a share can pass 100%%). \"Most in any\" counts the weight of the admitted calls whose whole span from call to reply lies in one span of that length, over every such span (the processes share the machine's clock); as in the hammer, the check uses %v, Redis time being whole milliseconds. "+
		"GCRA and a fixed window may admit up to twice their limit across a boundary, so only this library's sliding windows are checked per span, and redis_rate's share may pass 100%%.",
		p.Procs, p.Procs, p.Goroutines, p.Duration, p.Limit, p.Window, p.Limit, p.Window, p.Limit, p.Window, p.Duration, p.mostPossible(), p.checkSpan()), procsTableMD(rows))
}

// memoryTableMD is the memory table.
func memoryTableMD(rows []memoryRow) string {
	return markdownTable("| implementation | keys | keys / client | used_memory / client | PTTL after the calls | keys without expiry | empty (DBSIZE 0) after the last call | of which after the window | errors |\n"+
		"|---|---:|---:|---:|---:|---:|---:|---:|---|\n", rows, func(m memoryRow) string {
		return fmt.Sprintf("| %s | %s | %.2f | %.0f B | %s | %d | %s | %s | %s |\n",
			m.Impl, thousands(m.Keys), float64(m.Keys)/float64(m.Spec.Clients), m.perClient(), ttlSpan(m), m.NoTTL, m.gone(), m.pastWindow(), errorsCell(m.Errors, m.FirstErr))
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

func memorySection(b *strings.Builder, rows []memoryRow) {
	m := rows[0].Spec
	section(b, "Redis memory per limited client, and how long it stays", fmt.Sprintf("%s clients of one resource make %d calls each (%s calls from %d goroutines, about a second or less) under `PerClient(Per(%d, %v))`, each implementation in a logical database of its own on its server (this library's, scripting denied; the peers'). "+
		"used_memory / client is the server's used_memory (INFO memory) after the calls less before them, over the clients: it includes Redis's own overhead per key, and is noisy by a few bytes per client (client buffers). "+
		"PTTL is read from every key right after the calls. Then each database's DBSIZE is polled every %v, on the real clock, until it is 0 (Redis has expired every key) or %v after the last call: \"after the window\" is that time less the window, how long an idle client outlives its limit in Redis. "+
		"The figures are whatever the code measured does: a change to key expiry shows here on the next run.",
		thousands(int64(m.Clients)), m.Calls, thousands(int64(m.Clients*m.Calls)), m.Goroutines, m.Limit, m.Window, m.Poll, m.Bound), memoryTableMD(rows))
}
