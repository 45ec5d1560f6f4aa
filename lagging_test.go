package leakybucket

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// No duration of a Result exceeds the window when the process's estimate
// of Redis's time lags a call another process made: a Result counts the
// calls it reads from a time Redis has reached. Process a's replies reach
// it 30ms after Redis read its clock, so its estimate, which is never later
// than Redis's time, is tens of ms behind it; process b's is not. The
// Results of a's calls that read without writing (a weight that can never
// fit, PeekN) and of those that decide say the same: RetryAfter and
// ResetAfter at most the window.
func TestDurationsFromALaggingEstimate(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "the replies of a Redis client are delayed")
		rules := []Option{PerResource(Per(3, time.Second)), PerClient(Per(2, time.Second))}
		lagging := e.secondClient(t)
		addHookOn(lagging, lateReplies(30*ms))
		a, b := e.bucketOn(t, lagging, rules...), e.bucket(t, rules...)
		ctx := context.Background()
		calls := []struct {
			name string
			call func() (Result, error)
		}{
			{"a: AllowN(1)", func() (Result, error) { return a.AllowN(ctx, "r", "a", 1) }},
			{"b: AllowN(1)", func() (Result, error) { return b.AllowN(ctx, "r", "b", 1) }},
			{"a: AllowN(3), never fits", func() (Result, error) { return a.AllowN(ctx, "r", "a", 3) }},
			{"b: AllowN(1)", func() (Result, error) { return b.AllowN(ctx, "r", "b", 1) }},
			{"a: PeekN(2)", func() (Result, error) { return a.PeekN(ctx, "r", "a", 2) }},
			{"a: AllowN(1), the last that fits", func() (Result, error) { return a.AllowN(ctx, "r", "a", 1) }},
			{"a: AllowN(1), denied", func() (Result, error) { return a.AllowN(ctx, "r", "a", 1) }},
			{"a: PeekN(1), denied", func() (Result, error) { return a.PeekN(ctx, "r", "a", 1) }},
		}
		for _, c := range calls {
			res, err := c.call()
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if d := overWindow(res, time.Second); d != "" {
				t.Errorf("%s = %+v: %s", c.name, res, d)
			}
			// An admitted call is the newest: it is counted for a window
			// from its transaction's time, or from a stamp at most 1ms
			// before it (a later stamp is counted again from that time).
			if res.Allowed && res.ResetAfter < time.Second-ms {
				t.Errorf("%s = %+v: ResetAfter %v, want the window less at most 1ms", c.name, res, res.ResetAfter)
			}
		}
	})
}

// secondClient returns a new client of e's server, as another process of
// the service has.
func (e *env) secondClient(t *testing.T) redis.UniversalClient {
	t.Helper()
	if e.mini == nil {
		return e.otherClient(t)
	}
	rdb := miniClient(e.mini)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// addHookOn adds h to rdb, and on a cluster to every node's client, which is
// where a Bucket sends its commands.
func addHookOn(rdb redis.UniversalClient, h redis.Hook) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
		return
	}
	rdb.AddHook(h)
}

// overWindow says which duration of res exceeds window, if any: RetryAfter
// (unless Never) and ResetAfter, of res and of each rule.
func overWindow(res Result, window time.Duration) string {
	check := func(what string, d time.Duration) string {
		if d > window && d != Never {
			return fmt.Sprintf("%s %v exceeds the window %v", what, d, window)
		}
		return ""
	}
	durations := map[string]time.Duration{"RetryAfter": res.RetryAfter, "ResetAfter": res.ResetAfter}
	for i, rr := range res.Rules {
		durations[fmt.Sprintf("rule %d RetryAfter", i)] = rr.RetryAfter
		durations[fmt.Sprintf("rule %d ResetAfter", i)] = rr.ResetAfter
	}
	for what, d := range durations {
		if s := check(what, d); s != "" {
			return s
		}
	}
	return ""
}

// lateReplies delays every reply by its duration once it has arrived: the
// client measures a longer round trip than Redis saw, so its estimate of
// Redis's time lags Redis's by about as much.
type lateReplies time.Duration

func (d lateReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d lateReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		time.Sleep(time.Duration(d))
		return err
	}
}

func (d lateReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		time.Sleep(time.Duration(d))
		return err
	}
}
