package leakybucket

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/txn"
)

// stallRounds is how many pairs of admissions TestStallBeforeSend checks
// per strategy, alternating stalls of 20 and 40 ms.
const stallRounds = 10

// A process that stalls between stamping a batch and sending it (a GC
// pause, a starved CPU: here a hook that sleeps before MULTI, until the
// first call is admitted, and not after) never has two calls of Per(1,
// time.Second) admitted within one second of Redis's time: each call
// counts from no earlier than the transaction that recorded it. The check
// allows 1 ms for Redis's clock, which the strategies read in whole
// milliseconds.
func TestStallBeforeSend(t *testing.T) {
	eachOf(t, []Strategy{Logs, SortedSet, Windows(50 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the stall is a Redis client's hook")
		hook := &stallHook{}
		e.addHook(hook)
		for round := range stallRounds {
			stall := 20 * ms
			if round%2 == 1 {
				stall = 40 * ms
			}
			hook.stall.Store(int64(stall))
			// Each round stamps its first call at another point of an
			// interval, so that on fake time too some stalls cross into
			// the next one.
			time.Sleep(time.Duration(round*13%50) * ms)
			b := e.bucket(t, PerClient(Per(1, time.Second)))
			first, second := admitTwice(t, b, hook, fmt.Sprint("stall", round))
			if gap := second.Sub(first); gap < time.Second-ms {
				t.Errorf("round %d, a stall of %v: two calls admitted %v apart in Redis time, want at least 1s", round, stall, gap)
			}
		}
	})
}

// Under FixedWindows a call counts in the window of its stamp, unless
// Redis ran it more than 1 ms into the next: then the decision is made
// again, in the next. So a stall across a window's start never has two
// calls of Per(1, 250ms) admitted in one fixed window of Redis's time,
// but for a call that ran in its first millisecond (1 ms more for Redis's
// clock, read in whole milliseconds).
func TestStallBeforeSendFixed(t *testing.T) {
	eachOf(t, []Strategy{FixedWindows}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the stall is a Redis client's hook")
		hook := &stallHook{}
		e.addHook(hook)
		const window = 250 * ms
		for round := range stallRounds {
			stall := 20 * ms
			if round%2 == 1 {
				stall = 40 * ms
			}
			b := e.bucket(t, PerClient(Per(1, window)))
			resource := fmt.Sprint("stall", round)
			if _, err := b.Peek(context.Background(), resource, "c"); err != nil { // the first estimate of Redis's clock
				t.Fatal(err)
			}
			// Stamped half the stall before a window starts, run after.
			time.Sleep(time.Until(time.Now().Truncate(window).Add(window - stall/2)))
			hook.stall.Store(int64(stall))
			first, second := admitTwice(t, b, hook, resource)
			if first.UnixMilli()/window.Milliseconds() == second.UnixMilli()/window.Milliseconds() && first.UnixMilli()%window.Milliseconds() > 1 {
				t.Errorf("round %d, a stall of %v: two calls admitted at %v and %v of Redis time, in one fixed window of %v", round, stall, first, second, window)
			}
		}
	})
}

// admitTwice calls b until two calls of resource are admitted, and returns
// the Redis time of the decision of each.
func admitTwice(t *testing.T, b *Bucket, hook *stallHook, resource string) (first, second time.Time) {
	t.Helper()
	var at []time.Time
	for range 2000 {
		res, err := b.Allow(context.Background(), resource, "c")
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			hook.stall.Store(0) // the next admission's decision is not late
			if at = append(at, hook.latest()); len(at) == 2 {
				return at[0], at[1]
			}
		}
		time.Sleep(5 * ms)
	}
	t.Fatalf("%d admissions in 2000 calls, want 2", len(at))
	return
}

// stallHook sleeps for stall before each transaction it sends, and keeps
// the latest Redis time any reply of TIME carried.
type stallHook struct {
	stall atomic.Int64 // a time.Duration
	mu    sync.Mutex
	last  time.Time
}

func (h *stallHook) latest() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func (h *stallHook) saw(v any) {
	at, ok := txn.ReplyTime(v)
	if tc, isTime := v.(time.Time); isTime {
		at, ok = tc, true
	}
	if ok {
		h.mu.Lock()
		h.last = at
		h.mu.Unlock()
	}
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && commandName(cmd) == "time" {
			h.sawReply(cmd)
		}
		return err
	}
}

func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		inTxn := len(cmds) > 1 && commandName(cmds[0]) == "multi"
		if inTxn {
			time.Sleep(time.Duration(h.stall.Load()))
		}
		err := next(ctx, cmds)
		for i, cmd := range cmds {
			if commandName(cmd) != "time" {
				continue
			}
			h.sawReply(cmd) // sent alone, or in a transaction that sets it (TxPipelined)
			if exec, ok := cmds[len(cmds)-1].(*redis.Cmd); ok && inTxn {
				// Sent with Do: its reply is among EXEC's, after MULTI's.
				if replies, ok := exec.Val().([]any); ok && i-1 < len(replies) {
					h.saw(replies[i-1])
				}
			}
		}
		return err
	}
}

// sawReply keeps the time a TIME command read, sent alone or pipelined.
func (h *stallHook) sawReply(cmd redis.Cmder) {
	switch c := cmd.(type) {
	case *redis.TimeCmd:
		if c.Err() == nil {
			h.saw(c.Val())
		}
	case *redis.Cmd:
		if c.Err() == nil {
			h.saw(c.Val())
		}
	}
}
