// Package batch decides concurrent calls together, as singleflight shares
// one call among its callers. Calls that go to the same place (a key: the
// same lock under Logs, the same resource, or the same share of its
// clients, otherwise) queue in one line.
// A line's worker goroutine, started as calls arrive and gone once the
// line is empty, takes the waiting calls in batches and hands each batch
// to the function that Do was given, which decides its calls in arrival
// order, each seeing the ones before it, in one store round (one
// MULTI/EXEC, or one lock's two round trips under Logs). A hot resource
// then costs one round trip per batch instead of one per call.
//
// A line decides one batch at a time: the next starts once the one before
// it has answered its calls and handed on what it takes back. Two batches
// of a line under way at once would each count what the other wrote and
// then takes back (a call decided again, or denied), and so deny each
// other's calls on weight that is never admitted: a burst of calls from
// one process would admit less than its limit, with no later call to make
// up for it. Calls that arrive meanwhile wait, and are the next batch.
//
// A batch runs detached from its callers' contexts (it keeps the values of
// the first one's, for tracing): its deadline is the latest of theirs, and
// it is cancelled as soon as every one of its calls has given up. Each
// caller waits on its own context only, so it returns by its own deadline,
// with its own context's error, whatever the batch is doing; no caller ever
// fails because another one's context ended. A call may also be cut (its
// Cut closes: the breaker found the server gone), which ends its wait as
// its context's end would. A call that gives up before
// its batch decided it is recorded nowhere (a store that wrote it takes it
// back as it does a denied call); one that gives up while its batch writes
// may or may not have been counted (it can only have been counted, never
// admitted uncounted).
package batch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/lock"
)

// ErrCut is what Do returns for a call given up because its Cut closed.
var ErrCut = errors.New("leakybucket: call cut")

// maxBatch bounds the calls of one batch, and so the size of its
// MULTI/EXEC.
const maxBatch = 1024

type state uint8

const (
	waiting   state = iota // queued, not yet decided
	taken                  // decided by a batch whose write is under way
	abandoned              // its caller gave up
	finished               // res and err are final
)

// A Call is one caller's request Req, waiting for a batch to decide it.
type Call[Q, R any] struct {
	Ctx context.Context
	Req Q
	// Cut, if not nil, is closed when the call must give up at once, as
	// if its context had ended: Do then returns ErrCut.
	Cut  <-chan struct{}
	done chan struct{} // closed once finished

	// Guarded by the Group's mu.
	batch *batch[Q, R] // once taken
	state state
	res   R
	err   error
}

// A Line is what the batches of one key share beside their calls: what
// this process knows of the key's lock (Logs), and State, the Group
// user's (the take-backs a batch hands on to the next).
type Line[Q, R, S any] struct {
	Lock  lock.View
	State S

	group   *Group[Q, R, S]
	calls   []*Call[Q, R] // waiting, in arrival order
	lastErr error         // the error of the latest batch, nil if it succeeded
}

// Busy reports whether calls wait in the line: a batch after this one
// will carry what this one hands on.
func (l *Line[Q, R, S]) Busy() bool {
	l.group.mu.Lock()
	defer l.group.mu.Unlock()
	return len(l.calls) > 0
}

// batch is the calls a line's worker decides together.
type batch[Q, R any] struct {
	calls  []*Call[Q, R]
	cancel context.CancelFunc
}

// A Group holds the lines of one Bucket.
type Group[Q, R, S any] struct {
	idle func(line *Line[Q, R, S]) // see NewGroup

	mu    sync.Mutex
	lines map[string]*Line[Q, R, S] // by key

	// decision is a moving average of how long an uncontended batch takes
	// (ns), to refuse at once a batch that could not finish before the
	// latest deadline of its calls; tried is when a batch last ran (ns
	// since an arbitrary start), so that one runs at least every
	// probeEvery and the average never goes stale.
	decision atomic.Int64
	tried    atomic.Int64
}

// NewGroup returns a Group that calls idle, if not nil, when a line's
// worker stops: no batch is left to carry what the last one handed on.
func NewGroup[Q, R, S any](idle func(line *Line[Q, R, S])) *Group[Q, R, S] {
	return &Group[Q, R, S]{idle: idle, lines: map[string]*Line[Q, R, S]{}}
}

// A Run decides a batch: for each call, Answer with its result or Fail.
type Run[Q, R, S any] func(ctx context.Context, calls []*Call[Q, R], line *Line[Q, R, S]) error

// probeEvery is how often a batch runs even when the average says it
// cannot finish in time.
const probeEvery = 10 * time.Millisecond

// epoch is the start of the monotonic readings of Group.tried.
var epoch = time.Now()

// took records the duration of an uncontended batch.
func (q *Group[Q, R, S]) took(d time.Duration) {
	old := q.decision.Load()
	if old == 0 {
		q.decision.Store(int64(d))
		return
	}
	q.decision.Store(old + (int64(d)-old)/8)
}

// hopeless returns an error if ctx ends sooner than a decision takes: the
// batch would only hold the lock while others wait, for callers who will
// be gone. Its calls get the error at once, before their deadlines. One
// batch in probeEvery runs all the same, to measure again.
func (q *Group[Q, R, S]) hopeless(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	typical := time.Duration(q.decision.Load())
	now := time.Since(epoch)
	left := time.Until(deadline)
	if ok && left < typical && now-time.Duration(q.tried.Load()) < probeEvery {
		return fmt.Errorf("leakybucket: %w: %v left, and a decision takes about %v",
			context.DeadlineExceeded, left.Round(time.Microsecond), typical.Round(time.Microsecond))
	}
	q.tried.Store(int64(now))
	return nil
}

// Do queues c in the line key, and returns its result once a batch,
// decided by run, decided it, or its context's error once it ends. Every
// Do of a Group is given the same run.
func (q *Group[Q, R, S]) Do(key string, c *Call[Q, R], run Run[Q, R, S]) (R, error) {
	var zero R
	if c.Ctx.Err() != nil {
		return zero, GivenUp(c.Ctx, false, nil) // nothing sent
	}
	c.done = make(chan struct{})
	q.mu.Lock()
	// A line is in lines exactly while its worker runs: a new line
	// starts one.
	l := q.lines[key]
	start := l == nil
	if start {
		l = q.newLine()
		q.lines[key] = l
	}
	l.calls = append(l.calls, c)
	q.mu.Unlock()
	if start {
		go q.work(key, l, run)
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-c.Ctx.Done():
		return q.abandon(l, c, false)
	case <-c.Cut:
		return q.abandon(l, c, true)
	}
}

func (q *Group[Q, R, S]) newLine() *Line[Q, R, S] { return &Line[Q, R, S]{group: q} }

// abandon gives c up after its context ended, or its Cut closed (cut),
// and cancels the batch under way if no call of it is left waiting for
// it.
func (q *Group[Q, R, S]) abandon(l *Line[Q, R, S], c *Call[Q, R], cut bool) (R, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == finished {
		return c.res, c.err
	}
	c.state = abandoned
	if c.batch != nil && allAbandoned(c.batch.calls) {
		c.batch.cancel()
	}
	var zero R
	if cut {
		return zero, ErrCut
	}
	return zero, GivenUp(c.Ctx, l.Lock.Contended(), l.lastErr)
}

// Answer gives c the result res, once its batch's round is over, and
// reports whether its caller still waits for it: a caller gone (Gone)
// gets none, and returns its context's error, or ErrCut.
func (q *Group[Q, R, S]) Answer(c *Call[Q, R], res R) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state != waiting {
		return false
	}
	if c.Gone() {
		c.state = abandoned
		return false
	}
	c.state, c.res = taken, res
	return true
}

// Gone reports whether c's caller has given up, or is giving up: its
// context ended, or its Cut closed. Once Gone, a call stays gone, so a
// round that records only the calls not Gone records none whose caller
// Answer then finds gone before it.
func (c *Call[Q, R]) Gone() bool {
	if c.Ctx.Err() != nil {
		return true
	}
	select {
	case <-c.Cut:
		return true
	default:
		return false
	}
}

// Fail gives each of calls the error err in place of a result, when the
// rest of their batch was decided: the batch's finish leaves them so.
func (q *Group[Q, R, S]) Fail(calls []*Call[Q, R], err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range calls {
		if c.state == waiting {
			var zero R
			c.state, c.res, c.err = taken, zero, err
		}
	}
}

func allAbandoned[Q, R any](calls []*Call[Q, R]) bool {
	for _, c := range calls {
		if c.state != abandoned {
			return false
		}
	}
	return true
}

// GivenUp is the error of a call whose context ended before its decision:
// ErrLockNotObtained if the lock was then held by another holder (real
// contention); else the context's error, with the latest batch's error if
// it failed to reach Redis (ErrUnavailable and its cause).
func GivenUp(ctx context.Context, contended bool, lastErr error) error {
	cause := context.Cause(ctx)
	switch {
	case contended:
		return fmt.Errorf("%w: %w", lock.ErrNotObtained, cause)
	case errors.Is(lastErr, breaker.ErrUnavailable):
		return &waitError{cause: cause, last: lastErr}
	}
	return fmt.Errorf("leakybucket: %w while waiting for Redis", cause)
}

// waitError is a context's error that ended a wait for a Redis that had
// just failed: errors.Is matches both.
type waitError struct{ cause, last error }

func (e *waitError) Error() string {
	return "leakybucket: " + e.cause.Error() + " while waiting for Redis, after: " + strings.TrimPrefix(e.last.Error(), "leakybucket: ")
}

func (e *waitError) Unwrap() []error { return []error{e.cause, e.last} }

// work runs batches of line l with run until l is empty.
func (q *Group[Q, R, S]) work(key string, l *Line[Q, R, S], run Run[Q, R, S]) {
	for {
		b, ctx := q.next(key, l)
		if b == nil {
			if q.idle != nil {
				q.idle(l) // no batch left to carry what the last handed on
			}
			return
		}
		err := q.hopeless(ctx)
		if err == nil {
			start := time.Now()
			err = run(ctx, b.calls, l)
			if err == nil && l.Lock.FreeSince(start) {
				q.took(time.Since(start))
			}
		}
		q.finish(l, b, ctx, err)
		b.cancel()
	}
}

// next takes the next batch of l, with its context; nil once l is empty:
// the worker then stops, and removes l.
func (q *Group[Q, R, S]) next(key string, l *Line[Q, R, S]) (*batch[Q, R], context.Context) {
	q.mu.Lock()
	defer q.mu.Unlock()
	calls := make([]*Call[Q, R], 0, min(len(l.calls), maxBatch))
	rest := l.calls[:0]
	for _, c := range l.calls {
		switch {
		case c.state != waiting:
		case c.Ctx.Err() != nil:
			c.state = abandoned // its caller is giving up: start nothing for it
		case len(calls) < maxBatch:
			calls = append(calls, c)
		default:
			rest = append(rest, c)
		}
	}
	l.calls = rest
	if len(calls) == 0 {
		delete(q.lines, key)
		return nil, nil
	}
	ctx, cancel := batchContext(calls)
	b := &batch[Q, R]{calls: calls, cancel: cancel}
	for _, c := range calls {
		c.batch = b
	}
	return b, ctx
}

// batchContext is detached from the calls' contexts, with the latest of
// their deadlines, or none if one of them has none.
func batchContext[Q, R any](batch []*Call[Q, R]) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(batch[0].Ctx)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.Ctx.Deadline()
		if !ok {
			return context.WithCancel(detached)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(detached, latest)
}

// finish hands the outcome of batch to its calls. If the batch's context
// ended, every call's deadline has passed (the batch has the latest), or
// every call gave up: each gets the error it would have got by giving up.
func (q *Group[Q, R, S]) finish(l *Line[Q, R, S], b *batch[Q, R], ctx context.Context, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		err = GivenUp(ctx, l.Lock.Contended(), err)
	}
	l.lastErr = err
	for _, c := range b.calls {
		if c.state == abandoned {
			continue
		}
		if err != nil {
			var zero R
			c.res, c.err = zero, err
		}
		c.state = finished
		close(c.done)
	}
}

// Waiting returns how many calls wait in the line key behind the batch
// under way, or -1 if no line is: for tests that make calls in a known
// order.
func (q *Group[Q, R, S]) Waiting(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l, ok := q.lines[key]; ok {
		return len(l.calls)
	}
	return -1
}

// Contended reports whether the line key has seen its lock held by
// another holder.
func (q *Group[Q, R, S]) Contended(key string) bool {
	q.mu.Lock()
	l, ok := q.lines[key]
	q.mu.Unlock()
	return ok && l.Lock.Contended()
}

// Lines returns how many lines have calls waiting or under way.
func (q *Group[Q, R, S]) Lines() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.lines)
}
