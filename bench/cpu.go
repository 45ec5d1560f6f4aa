package main

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// What a decision costs each side, in CPU time: the bench process's
// (getrusage of RUSAGE_SELF: user + system, every thread) and the
// server's (INFO cpu: used_cpu_user + used_cpu_sys, every thread of
// redis-server), each read just before a cell's calls start and just after
// the last one is answered. Cells run one at a time, and each
// implementation runs on its server alone (the other server idles), so a
// server's CPU during a cell is that implementation's. What each side
// spends idle (Redis's cron, go-redis's pool upkeep, a tick of the Go
// runtime) is measured once, before the first table, and its share of the
// cell is taken off. The client's figure includes the harness's own work
// per call (a context with a deadline, two clock reads, a tally), the same
// for every row.

// A cpuMeter measures the CPU time of the cells on one server.
type cpuMeter struct {
	admin      *redis.Client // INFO cpu
	serverIdle float64       // CPU seconds per second, idle
	clientIdle float64
}

// cpuUse is the CPU time the calls of one cell took.
type cpuUse struct {
	Client, Server time.Duration
}

// cpuMark is a reading of both sides' CPU time.
type cpuMark struct {
	at             time.Time
	client, server time.Duration
}

// mark reads both sides. It first collects the garbage the process made
// before, so that a cell pays for its own collections and not for those of
// the cell before it.
func (m *cpuMeter) mark(ctx context.Context) (cpuMark, error) {
	runtime.GC()
	server, err := serverCPU(ctx, m.admin)
	return cpuMark{at: time.Now(), client: processCPU(), server: server}, err
}

// since is the CPU time each side spent since start, less what it spends
// idle in as long.
func (m *cpuMeter) since(ctx context.Context, start cpuMark) (cpuUse, error) {
	end, client := time.Now(), processCPU()
	server, err := serverCPU(ctx, m.admin)
	if err != nil {
		return cpuUse{}, err
	}
	idle := end.Sub(start.at).Seconds()
	return cpuUse{
		Client: max(client-start.client-seconds(m.clientIdle*idle), 0),
		Server: max(server-start.server-seconds(m.serverIdle*idle), 0),
	}, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// serverCPU is the server's used_cpu_user + used_cpu_sys (INFO cpu), which
// it reports to the microsecond.
func serverCPU(ctx context.Context, admin *redis.Client) (time.Duration, error) {
	info, err := admin.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %w", err)
	}
	var total float64
	found := 0
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k != "used_cpu_user" && k != "used_cpu_sys" {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", k, err)
		}
		total, found = total+x, found+1
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu has no used_cpu_user and used_cpu_sys: %q", info)
	}
	return seconds(total), nil
}

// measureIdle learns what the process and each server spend idle, over a
// second (a quarter with -quick), before any cell.
func (r *runner) measureIdle(ctx context.Context) error {
	span := time.Second
	if r.cfg.quick {
		span = time.Second / 4
	}
	if err := measureIdle(ctx, span, r.lib, r.peers); err != nil {
		return fmt.Errorf("measuring idle CPU: %w", err)
	}
	fmt.Fprintf(r.log, "bench: idle CPU: this process %.2f ms/s; the library's server %.2f ms/s, the peers' %.2f ms/s, taken off each cell's\n",
		1000*r.lib.meter.clientIdle, 1000*r.lib.meter.serverIdle, 1000*r.peers.meter.serverIdle)
	return nil
}

// measureIdle learns what the process and each side's server spend idle,
// over span, while nothing calls.
func measureIdle(ctx context.Context, span time.Duration, sides ...*side) error {
	marks := make([]cpuMark, len(sides))
	for i, s := range sides {
		var err error
		if marks[i], err = s.meter.mark(ctx); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(span):
	}
	for i, s := range sides {
		use, err := s.meter.since(ctx, marks[i])
		if err != nil {
			return err
		}
		took := time.Since(marks[i].at).Seconds()
		s.meter.clientIdle, s.meter.serverIdle = use.Client.Seconds()/took, use.Server.Seconds()/took
	}
	return nil
}

// perDecision is a CPU time over n decisions, in µs.
func perDecision(d time.Duration, n int64) float64 {
	return float64(d) / float64(time.Microsecond) / float64(max(n, 1))
}

// micros formats µs per decision; "–" where it was not measured. A cell
// whose calls cost less than the idle share (the denial cache answering
// in process) shows 0.0.
func micros(x float64) string {
	if x < 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f µs", x)
}
