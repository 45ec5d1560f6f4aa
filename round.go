package leakybucket

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A round is one lock-free decision of a batch, as SortedSet and Windows
// make it: one MULTI/EXEC (txn.go) that records the calls and reads the
// counts, then the calls judged in order from what it returned, then, if
// some call was not recorded, a second transaction that takes its writes
// back.
type round interface {
	// queue adds the batch's commands to t.
	queue(t *txn)
	// judge reads t's replies, asks judge about each call in order, and
	// queues on back the take-back of the calls not recorded.
	judge(t *txn, judge judgeFunc, back *txn) error
	// takeAll queues on back the take-back of every call, for a
	// transaction that ran although its reply was lost: every caller got
	// an error, so none may count.
	takeAll(back *txn)
	// idempotent reports whether a take-back may run twice (SortedSet's
	// ZREM) or must run once (Windows' HINCRBY): then the transactions are
	// marked, for resolve to tell whether they ran.
	idempotent() bool
}

// clockRefresh is how often a decision carries TIME, to keep the estimate
// of Redis's clock fresh.
const clockRefresh = time.Second

// decideRound runs r, built for the calls at the estimated Redis time.
// When the transaction's reply is lost, it returns the error at once and,
// in the background, takes the calls back if the transaction ran.
func decideRound(ctx context.Context, at site, newRound func(now int64) round, judge judgeFunc) error {
	now, err := at.clock.estimate(ctx, at.node)
	if err != nil {
		return err
	}
	r := newRound(now)
	t := newTxn(at.keys, !r.idempotent())
	clock := -1
	if at.clock.olderThan(clockRefresh) {
		clock = t.add("time")
	}
	r.queue(t)
	sent := time.Now()
	switch o, err := t.exec(ctx, at.node); o {
	case notRun:
		return err
	case unknown:
		at.clock.reset()
		go takeAllBack(at, r, t)
		return err
	}
	if clock >= 0 {
		if server, ok := replyTime(t.replies[clock]); ok {
			at.clock.sample(server, sent)
		}
	}
	back := newTxn(at.keys, !r.idempotent())
	if err := r.judge(t, judge, back); err != nil {
		return err
	}
	takeBack(at, back, r.idempotent())
	return nil
}

// takeAllBack takes back every call of r, whose transaction t lost its
// reply, once resolve says it ran (or, its take-back being idempotent,
// that it ran if it ever will).
func takeAllBack(at site, r round, t *txn) {
	o := t.resolve(at.node, true)
	if o == ran || o == unknown && r.idempotent() {
		back := newTxn(at.keys, !r.idempotent())
		r.takeAll(back)
		takeBack(at, back, r.idempotent())
	}
}

// takeBackFor bounds how long a take-back is tried: the slot of the
// resource may be moving to another node meanwhile.
const takeBackFor = 5 * time.Second

// takeBack runs back, if it holds anything: an idempotent one until it
// ran, another exactly once if it can (one that did not run is sent again;
// one whose reply was lost is resolved, never sent twice), to the slot's
// new owner if it was redirected. A take-back that cannot be made leaves
// the calls counted: others are denied sooner, never admitted past a
// limit. It runs detached from the callers' contexts, which may have
// ended: a caller that gave up must not stay counted.
func takeBack(at site, back *txn, idempotent bool) {
	if len(back.cmds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), takeBackFor)
	defer cancel()
	node, backoff := at.node, resolveFirstBackoff
	for {
		over, err := tryTakeBack(ctx, node, back, idempotent)
		if over || ctx.Err() != nil {
			return
		}
		if at.route.redirected(err) != nil && at.refind != nil {
			if moved, err := at.refind(ctx); err == nil {
				node = moved
			}
		}
		_ = sleep(ctx, backoff) // ctx's end is seen above
		backoff = min(2*backoff, resolveMaxBackoff)
		back = back.again(at.keys)
	}
}

// tryTakeBack makes one attempt of takeBack, and reports whether it is
// over: it ran, it may have run and must not run twice, or the client was
// closed.
func tryTakeBack(ctx context.Context, node *redis.Client, back *txn, idempotent bool) (bool, error) {
	o, err := back.exec(ctx, node)
	if o == unknown && !idempotent {
		o = back.resolve(node, false)
	}
	over := o == ran || o == unknown && !idempotent || errors.Is(err, redis.ErrClosed)
	return over, err
}
