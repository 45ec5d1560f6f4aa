// Package batch queues concurrent calls so that they are decided
// together, as singleflight shares one call among its callers. Calls that go to the same place (a key: the
// same lock under Logs, the same resource, or the same share of its
// clients, otherwise) queue in one line.
// A line's worker goroutine, which the caller whose call finds the line
// idle starts (Join), takes the waiting calls in batches (Next), decides
// each batch's calls in arrival order, each seeing the ones before it, in
// one store round (one MULTI/EXEC, or one lock's two round trips under
// Logs), hands each caller its answer (Answer, Finish), and stops once
// the line is empty. The worker is the package user's code, so a reader
// sees at the call what decides it. A hot resource then costs one round
// trip per batch instead of one per call.
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
	"github.com/leakybucket/leakybucket/internal/store"
)

// ErrCut is what Wait returns for a call given up because its Cut closed.
var ErrCut = errors.New("leakybucket: call cut")

// maxBatch bounds the calls of one batch, and so the size of its
// MULTI/EXEC.
const maxBatch = 1024

type state uint8

const (
	waiting   state = iota // queued, not yet decided
	taken                  // decided by a batch whose write is under way
	abandoned              // its caller gave up
	finished               // err is final
)

// A Call is one caller's call, waiting for a batch to decide it. The
// package's user embeds it in its own call, which holds the request and
// the result (see Caller).
type Call struct {
	Ctx context.Context
	// Cut, if not nil, is closed when the call must give up at once, as
	// if its context had ended: Wait then returns ErrCut.
	Cut  <-chan struct{}
	done chan struct{} // closed once finished

	// Guarded by the Group's mu.
	batch *Batch // once taken
	state state
	err   error
}

// A Caller is a call as the package's user holds it: a struct that
// embeds Call, and whose result the user writes once Answer says that its
// caller waits for it.
type Caller interface{ call() *Call }

func (c *Call) call() *Call { return c }

// A Line is what the batches of one key share beside their calls: what
// this process knows of the key's lock (Logs), and the take-backs a batch
// hands on to the next (store.Carried).
type Line struct {
	Lock    lock.View
	Carried store.Carried

	key     string
	calls   []Caller // waiting, in arrival order
	lastErr error    // the error of the latest batch, nil if it succeeded
	group   *Group
}

// Busy reports whether calls wait in the line: a batch after this one
// will carry what this one hands on.
func (l *Line) Busy() bool {
	l.group.mu.Lock()
	defer l.group.mu.Unlock()
	return len(l.calls) > 0
}

// A Batch is the calls a line's worker decides together, in arrival
// order, under Ctx (see batchContext).
type Batch struct {
	Calls  []Caller
	Ctx    context.Context
	cancel context.CancelFunc
	start  time.Time
}

// A Group holds the lines of one Bucket.
type Group struct {
	mu    sync.Mutex
	lines map[string]*Line // by key

	// decision is a moving average of how long an uncontended batch takes
	// (ns), to refuse at once a batch that could not finish before the
	// latest deadline of its calls; tried is when a batch last ran (ns
	// since an arbitrary start), so that one runs at least every
	// probeEvery and the average never goes stale.
	decision atomic.Int64
	tried    atomic.Int64
}

// NewGroup returns a Group with no line.
func NewGroup() *Group { return &Group{lines: map[string]*Line{}} }

// probeEvery is how often a batch runs even when the average says it
// cannot finish in time.
const probeEvery = 10 * time.Millisecond

// epoch is the start of the monotonic readings of Group.tried.
var epoch = time.Now()

// took records the duration of an uncontended batch.
func (q *Group) took(d time.Duration) {
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
func (q *Group) hopeless(ctx context.Context) error {
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

// Join queues c in the line key. If the line was idle, first is true: the
// caller then starts the line's worker, which takes its batches (Next)
// until none is left. A call whose context has ended is queued nowhere,
// and gets its error.
func (q *Group) Join(key string, c Caller) (l *Line, first bool, err error) {
	call := c.call()
	if call.Ctx.Err() != nil {
		return nil, false, GivenUp(call.Ctx, false, nil) // nothing sent
	}
	call.done = make(chan struct{})
	q.mu.Lock()
	defer q.mu.Unlock()
	// A line is in lines exactly while its worker runs: a new line
	// starts one.
	l = q.lines[key]
	if first = l == nil; first {
		l = &Line{key: key, group: q}
		q.lines[key] = l
	}
	l.calls = append(l.calls, c)
	return l, first, nil
}

// Wait returns once a batch decided c (the error is that of its batch, if
// it failed), or with its context's error once it ends, or ErrCut once
// its Cut closes.
func (q *Group) Wait(l *Line, c Caller) error {
	call := c.call()
	select {
	case <-call.done:
		return call.err
	case <-call.Ctx.Done():
		return q.abandon(l, call, false)
	case <-call.Cut:
		return q.abandon(l, call, true)
	}
}

// abandon gives c up after its context ended, or its Cut closed (cut),
// and cancels the batch under way if no call of it is left waiting for
// it.
func (q *Group) abandon(l *Line, c *Call, cut bool) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == finished {
		return c.err
	}
	c.state = abandoned
	if c.batch != nil && allAbandoned(c.batch.Calls) {
		c.batch.cancel()
	}
	if cut {
		return ErrCut
	}
	return GivenUp(c.Ctx, l.Lock.Contended(), l.lastErr)
}

// Answer reports whether c's caller still waits for its result, once its
// batch's round is over: the user then writes it. A caller gone (Gone)
// gets none, and returns its context's error, or ErrCut.
func (q *Group) Answer(c Caller) bool {
	call := c.call()
	q.mu.Lock()
	defer q.mu.Unlock()
	if call.state != waiting {
		return false
	}
	if call.Gone() {
		call.state = abandoned
		return false
	}
	call.state = taken
	return true
}

// Gone reports whether c's caller has given up, or is giving up: its
// context ended, or its Cut closed. Once Gone, a call stays gone, so a
// round that records only the calls not Gone records none whose caller
// Answer then finds gone before it.
func (c *Call) Gone() bool {
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

// Fail gives c the error err in place of a result, when the rest of its
// batch was decided: the batch's finish leaves it so.
func (q *Group) Fail(c Caller, err error) {
	call := c.call()
	q.mu.Lock()
	defer q.mu.Unlock()
	if call.state == waiting {
		call.state, call.err = taken, err
	}
}

func allAbandoned(calls []Caller) bool {
	for _, c := range calls {
		if c.call().state != abandoned {
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

// Next takes the next batch of l, for its worker; nil once l is empty:
// the worker then stops, and l is removed (the next call starts a new
// line). A batch that could not finish before its calls' deadlines
// (hopeless) is not returned: its calls get their error at once.
func (q *Group) Next(l *Line) *Batch {
	for {
		b := q.take(l)
		if b == nil {
			return nil
		}
		err := q.hopeless(b.Ctx)
		if err == nil {
			b.start = time.Now()
			return b
		}
		q.finish(l, b, err)
	}
}

// Finish hands the outcome of b, err, to its calls, once its worker
// decided it.
func (q *Group) Finish(l *Line, b *Batch, err error) {
	if err == nil && l.Lock.FreeSince(b.start) {
		q.took(time.Since(b.start))
	}
	q.finish(l, b, err)
}

// take takes the waiting calls of l as a batch, with its context; nil
// once l is empty, and then removes l.
func (q *Group) take(l *Line) *Batch {
	q.mu.Lock()
	defer q.mu.Unlock()
	calls := make([]Caller, 0, min(len(l.calls), maxBatch))
	rest := l.calls[:0]
	for _, c := range l.calls {
		call := c.call()
		switch {
		case call.state != waiting:
		case call.Ctx.Err() != nil:
			call.state = abandoned // its caller is giving up: start nothing for it
		case len(calls) < maxBatch:
			calls = append(calls, c)
		default:
			rest = append(rest, c)
		}
	}
	l.calls = rest
	if len(calls) == 0 {
		delete(q.lines, l.key)
		return nil
	}
	ctx, cancel := batchContext(calls)
	b := &Batch{Calls: calls, Ctx: ctx, cancel: cancel}
	for _, c := range calls {
		c.call().batch = b
	}
	return b
}

// batchContext is detached from the calls' contexts, with the latest of
// their deadlines, or none if one of them has none.
func batchContext(calls []Caller) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(calls[0].call().Ctx)
	var latest time.Time
	for _, c := range calls {
		d, ok := c.call().Ctx.Deadline()
		if !ok {
			return context.WithCancel(detached)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(detached, latest)
}

// finish hands the outcome of b to its calls. If the batch's context
// ended, every call's deadline has passed (the batch has the latest), or
// every call gave up: each gets the error it would have got by giving up.
func (q *Group) finish(l *Line, b *Batch, err error) {
	defer b.cancel()
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil && b.Ctx.Err() != nil {
		err = GivenUp(b.Ctx, l.Lock.Contended(), err)
	}
	l.lastErr = err
	for _, c := range b.Calls {
		call := c.call()
		if call.state == abandoned {
			continue
		}
		if err != nil {
			call.err = err
		}
		call.state = finished
		close(call.done)
	}
}

// Waiting returns how many calls wait in the line key behind the batch
// under way, or -1 if no line is: for tests that make calls in a known
// order.
func (q *Group) Waiting(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if l, ok := q.lines[key]; ok {
		return len(l.calls)
	}
	return -1
}

// Contended reports whether the line key has seen its lock held by
// another holder.
func (q *Group) Contended(key string) bool {
	q.mu.Lock()
	l, ok := q.lines[key]
	q.mu.Unlock()
	return ok && l.Lock.Contended()
}

// Lines returns how many lines have calls waiting or under way.
func (q *Group) Lines() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.lines)
}
