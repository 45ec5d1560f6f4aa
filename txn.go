package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// A txn is one MULTI/EXEC that runs at most once, and never after its
// fence's deadline, sent in one round trip:
//
//	SET fence pending NX PXAT deadline
//	WATCH fence
//	MULTI, the commands, SET fence done PXAT deadline+fenceDoneGrace, EXEC
//
// Redis (>= 7.0) aborts an EXEC whose watched key expired, so a
// transaction that reaches a paused or slow server after its deadline
// writes nothing. When its reply is lost (a timeout, a cut connection),
// resolve learns from the fence whether it ran: "done" means it did; a
// fence still pending, or gone after the deadline without "done", means it
// never will. So a decision whose caller gave up is either taken back or
// never made: it is not counted after its caller gave up for longer than
// resolve takes.
//
// The commands are sent with Do, and their replies read by hand from the
// EXEC's: go-redis's TxPipelined cannot send SET and WATCH before MULTI in
// the same round trip.
type txn struct {
	fence    string
	deadline int64 // Redis ms
	cmds     [][]any
	replies  []any // after the EXEC, by command
}

// fenceLife bounds how long after it was sent a transaction may still run:
// one that takes longer aborts, and is sent again if its callers still
// wait. fenceDoneGrace is how long "done" outlives the deadline, for
// resolve to see.
const (
	fenceLife      = 250 * time.Millisecond
	fenceDoneGrace = 500 * time.Millisecond
)

// errFenced: the transaction reached Redis after its fence's deadline.
var errFenced = errors.New("leakybucket: the transaction reached Redis after its deadline and was not run")

// newTxn returns an empty transaction fenced in keys' slot, with the
// deadline now (Redis ms) plus fenceLife.
func newTxn(keys keyspace, now int64) *txn {
	return &txn{fence: keys.fence(strconv.FormatUint(rand.Uint64(), 36)), deadline: now + fenceLife.Milliseconds()}
}

// refenced returns t with a new fence, to send again after it did not run.
func (t *txn) refenced(keys keyspace, now int64) *txn {
	fresh := newTxn(keys, now)
	fresh.cmds = t.cmds
	return fresh
}

// add queues a command and returns its index among the replies.
func (t *txn) add(args ...any) int {
	t.cmds = append(t.cmds, args)
	return len(t.cmds) - 1
}

type txnOutcome uint8

const (
	unknown txnOutcome = iota // the reply was lost: see resolve
	ran
	notRun
)

// exec sends t on node and reports whether it ran. With notRun the error
// says why (errFenced, or a command's own error, such as MOVED); with
// unknown, why the reply was lost.
func (t *txn) exec(ctx context.Context, node *redis.Client) (txnOutcome, error) {
	var exec *redis.Cmd
	queued := make([]*redis.Cmd, len(t.cmds))
	_, err := node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, "set", t.fence, "pending", "nx", "pxat", t.deadline)
		pipe.Do(ctx, "watch", t.fence)
		pipe.Do(ctx, "multi")
		for i, args := range t.cmds {
			queued[i] = pipe.Do(ctx, args...)
		}
		pipe.Do(ctx, "set", t.fence, "done", "pxat", t.deadline+fenceDoneGrace.Milliseconds())
		exec = pipe.Do(ctx, "exec")
		return nil
	})
	execErr := exec.Err()
	switch {
	case execErr == nil:
		replies, ok := exec.Val().([]any)
		if !ok || len(replies) != len(t.cmds)+1 {
			return unknown, fmt.Errorf("leakybucket: EXEC replied %T with %d replies", exec.Val(), len(replies))
		}
		t.replies = replies[:len(t.cmds)]
		return ran, nil
	case errors.Is(execErr, redis.Nil):
		return notRun, errFenced
	case isRedisError(execErr):
		return notRun, queuedError(queued, execErr) // EXECABORT
	}
	return unknown, err
}

func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// queuedError is the error of the first command Redis refused to queue
// (MOVED, ASK, NOPERM...), or else err.
func queuedError(queued []*redis.Cmd, err error) error {
	for _, c := range queued {
		if c.Err() != nil {
			return c.Err()
		}
	}
	return err
}

// Backoff of resolve's attempts.
const (
	resolveFirstBackoff = 2 * time.Millisecond
	resolveMaxBackoff   = 50 * time.Millisecond
)

// resolve learns whether t ran after its reply was lost, on a connection of
// its own, detached from any caller. It returns unknown only if Redis
// could not be asked in time: its fence's "done" expired unseen.
func (t *txn) resolve(node *redis.Client) txnOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), fenceLife+fenceDoneGrace+holdGrace)
	defer cancel()
	backoff := resolveFirstBackoff
	for {
		o, err := t.look(ctx, node)
		switch {
		case err == nil && o != unknown:
			return o
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, redis.ErrClosed):
			// No server runs there: it cannot run what it never read.
			return notRun
		case ctx.Err() != nil:
			return unknown
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, resolveMaxBackoff)
	}
}

// look makes one attempt of resolve.
func (t *txn) look(ctx context.Context, node *redis.Client) (txnOutcome, error) {
	var get *redis.StringCmd
	var clock *redis.TimeCmd
	_, err := node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		get = pipe.Get(ctx, t.fence)
		clock = pipe.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return unknown, err
	}
	now := clock.Val().UnixMilli()
	switch {
	case get.Val() == "done":
		return ran, nil
	case now < t.deadline:
		return unknown, nil // pending, or not there yet: it may still run
	case now < t.deadline+fenceDoneGrace.Milliseconds():
		return notRun, nil // past the deadline, and not done: it never will
	}
	return unknown, nil // "done" may have expired unseen
}

// Replies of EXEC, as go-redis reads them (RESP3 or RESP2).

func replyInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

// replyScores reads a ZRANGE ... WITHSCORES reply as its scores.
func replyScores(v any) []float64 {
	items, _ := v.([]any)
	var out []float64
	for i := 0; i < len(items); i++ {
		switch item := items[i].(type) {
		case []any: // RESP3: [member, score]
			if len(item) == 2 {
				out = append(out, replyFloat(item[1]))
			}
		default: // RESP2: member, score, ...
			if i+1 < len(items) {
				out = append(out, replyFloat(items[i+1]))
				i++
			}
		}
	}
	return out
}

func replyFloat(v any) float64 {
	switch f := v.(type) {
	case float64:
		return f
	case string:
		x, _ := strconv.ParseFloat(f, 64)
		return x
	case int64:
		return float64(f)
	}
	return 0
}

// replyHash reads an HGETALL reply.
func replyHash(v any) map[string]string {
	out := map[string]string{}
	switch h := v.(type) {
	case map[any]any: // RESP3
		for k, v := range h {
			out[fmt.Sprint(k)] = fmt.Sprint(v)
		}
	case []any: // RESP2
		for i := 0; i+1 < len(h); i += 2 {
			out[fmt.Sprint(h[i])] = fmt.Sprint(h[i+1])
		}
	}
	return out
}

// replyTime reads a TIME reply.
func replyTime(v any) (time.Time, bool) {
	parts, _ := v.([]any)
	if len(parts) != 2 {
		return time.Time{}, false
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(parts[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(parts[1]), 10, 64)
	return time.Unix(sec, usec*1000), err1 == nil && err2 == nil
}
