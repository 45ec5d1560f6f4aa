package main

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// trips is a go-redis hook that counts round trips: a single command, or a
// pipeline (a MULTI/EXEC included), is one. The handshake of a new pooled
// connection (HELLO, CLIENT SETINFO) is not a decision's cost and is not
// counted. It also counts every script command sent, so that the
// scripting-denied client can prove it sent none.
type trips struct {
	n       atomic.Int64
	scripts atomic.Int64
}

func handshake(cmd redis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

func script(cmd redis.Cmder) bool {
	switch strings.ToLower(cmd.Name()) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "script", "fcall", "fcall_ro", "function":
		return true
	}
	return false
}

// phaseKey keys, in a call's context, a counter of the round trips of one
// phase of the work (the in-flight table counts an acquisition's apart from
// a release's), counted beside the hook's total.
type phaseKey struct{}

// withPhase returns ctx, whose round trips are also counted in c.
func withPhase(ctx context.Context, c *atomic.Int64) context.Context {
	return context.WithValue(ctx, phaseKey{}, c)
}

// add counts one round trip, and in the phase of ctx if it has one.
func (t *trips) add(ctx context.Context) {
	t.n.Add(1)
	if c, ok := ctx.Value(phaseKey{}).(*atomic.Int64); ok {
		c.Add(1)
	}
}

func (t *trips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			t.add(ctx)
		}
		if script(cmd) {
			t.scripts.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (t *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !handshake(cmds[0]) {
			t.add(ctx)
		}
		for _, c := range cmds {
			if script(c) {
				t.scripts.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted samples,
// by the nearest-rank method.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func sortedDurations(ns []int64) []time.Duration {
	d := make([]time.Duration, len(ns))
	for i, v := range ns {
		d[i] = time.Duration(v)
	}
	slices.Sort(d)
	return d
}
