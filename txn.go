package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A txn is one MULTI/EXEC that runs at most once, and never after its
// fence's deadline, sent in one round trip:
//
//	SET fence pending NX PXAT deadline
//	WATCH fence
//	MULTI, the commands, SET fence done PX fenceDoneGrace, EXEC
//
// Redis (>= 7.0) aborts an EXEC whose watched key expired between WATCH
// and EXEC, so a transaction that Redis starts before its deadline and
// finishes after it writes nothing. When its reply is lost (a timeout, a
// cut connection), resolve learns from the fence whether it ran: "done",
// which lives fenceDoneGrace after the transaction ran, means it did;
// nothing there once Redis answers again and the deadline has passed means
// it did not. A transaction that reaches Redis only after its deadline
// (the server was paused with it unread) is not stopped by the fence, as
// its SET then makes a key already expired, which WATCH ignores: it runs
// as Redis resumes, and resolve, polling until Redis answers, sees its
// "done" and takes it back. So a decision whose caller gave up is taken
// back, or never made.
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

// fenceLife bounds how long after it was sent a transaction may start. A
// fence's "done" lives fenceDoneGrace after its transaction ran, for
// resolve to see. resolve polls for at most resolveFor, and decides that a
// transaction did not run once Redis, past the deadline, has answered for
// resolveSettle without showing "done": long enough for the server to
// read what it had buffered when it was paused.
const (
	fenceLife      = 250 * time.Millisecond
	fenceDoneGrace = 500 * time.Millisecond
	resolveFor     = 10 * time.Second
	resolveSettle  = 20 * time.Millisecond
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
		// Sent again after a lost reply, by go-redis's retries, the
		// transaction would run twice (its fence says done, not pending).
		_ = pipe.Process(ctx, noRetry{redis.NewCmd(ctx, "set", t.fence, "pending", "nx", "pxat", t.deadline)})
		pipe.Do(ctx, "watch", t.fence)
		pipe.Do(ctx, "multi")
		for i, args := range t.cmds {
			queued[i] = pipe.Do(ctx, args...)
		}
		pipe.Do(ctx, "set", t.fence, "done", "px", fenceDoneGrace.Milliseconds())
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

// noRetry is a command that go-redis never sends again, nor the pipeline
// that holds it.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

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
	resolveMaxBackoff   = 200 * time.Millisecond
)

// resolve learns whether t ran after its reply was lost, on a connection of
// its own, detached from any caller. It returns unknown if Redis could not
// be asked within resolveFor.
func (t *txn) resolve(node *redis.Client) txnOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), resolveFor)
	defer cancel()
	backoff := resolveFirstBackoff
	var answered time.Time // when Redis first answered past the deadline
	for {
		done, past, err := t.look(ctx, node)
		switch {
		case done:
			return ran
		case errors.Is(err, redis.ErrClosed):
			return unknown // the client was closed: nothing more can be sent
		case err != nil:
			// Even a refused connection proves nothing: a proxy may refuse
			// while the server runs what it had read.
			answered = time.Time{}
		case !past:
		case answered.IsZero():
			answered = time.Now()
		case time.Since(answered) >= resolveSettle:
			return notRun
		}
		if ctx.Err() != nil {
			return unknown
		}
		_ = sleep(ctx, backoff) // ctx's end is seen above
		backoff = min(2*backoff, resolveMaxBackoff)
	}
}

// look makes one attempt of resolve: whether the fence says done, and
// whether Redis's time is past the deadline.
func (t *txn) look(ctx context.Context, node *redis.Client) (done, past bool, err error) {
	var get *redis.StringCmd
	var clock *redis.TimeCmd
	_, err = node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		get = pipe.Get(ctx, t.fence)
		clock = pipe.Time(ctx)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, false, err
	}
	return get.Val() == "done", clock.Val().UnixMilli() >= t.deadline, nil
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
