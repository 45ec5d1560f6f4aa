package leakybucket

import (
	"context"
	"time"
)

// A round is one lock-free decision of a batch, as SortedSet and Windows
// make it: one fenced MULTI/EXEC (txn.go) that records the calls and reads
// the counts, then the calls judged in order from what it returned, then,
// if some call was not recorded, a second fenced transaction that takes
// its writes back.
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
}

// decideRound runs r, built for the calls at the estimated Redis time.
// When the transaction's reply is lost, it returns the error at once and
// resolves in the background whether the transaction ran, to take it all
// back if it did.
func decideRound(ctx context.Context, at site, newRound func(now int64) round, judge judgeFunc) error {
	now, err := at.clock.estimate(ctx, at.node)
	if err != nil {
		return err
	}
	r := newRound(now)
	t := newTxn(at.keys, now)
	clock := t.add("time")
	r.queue(t)
	sent := time.Now()
	switch o, err := t.exec(ctx, at.node); o {
	case notRun:
		return err
	case unknown:
		at.clock.reset()
		go func() {
			if t.resolve(at.node) == ran {
				back := newTxn(at.keys, now)
				r.takeAll(back)
				takeBack(at, back)
			}
		}()
		return err
	}
	if server, ok := replyTime(t.replies[clock]); ok {
		at.clock.sample(server, sent)
	}
	back := newTxn(at.keys, now)
	if err := r.judge(t, judge, back); err != nil {
		return err
	}
	takeBack(at, back)
	return nil
}

// takeBackFor bounds how long a take-back is tried: the slot of the
// resource may be moving to another node meanwhile.
const takeBackFor = 5 * time.Second

// takeBack runs back, if it holds anything, exactly once if it can: a
// transaction that did not run is sent again with a new fence (to the
// slot's new owner, if it was redirected); one whose reply was lost is
// resolved, never sent twice. A take-back that cannot be made leaves the
// calls counted: others are denied sooner, never admitted past a limit.
// It runs detached from the callers' contexts, which may have ended: a
// caller that gave up must not stay counted.
func takeBack(at site, back *txn) {
	if len(back.cmds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), takeBackFor)
	defer cancel()
	node, backoff := at.node, resolveFirstBackoff
	for {
		o, err := back.exec(ctx, node)
		if o == unknown {
			o = back.resolve(node)
		}
		if o != notRun || ctx.Err() != nil {
			return
		}
		if at.route.redirected(err) != nil && at.refind != nil {
			if moved, err := at.refind(ctx); err == nil {
				node = moved
			}
		}
		_ = sleep(ctx, backoff) // ctx's end is seen above
		backoff = min(2*backoff, resolveMaxBackoff)
		now, err := at.clock.estimate(ctx, node)
		if err != nil {
			continue
		}
		back = back.refenced(at.keys, now)
	}
}
