package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leakybucket/leakybucket/internal/lock"
)

// Batching. Concurrent AllowN calls of one process that go to the same
// place (the same lock under Logs, the same resource otherwise) queue in
// one line. Worker goroutines, started as calls arrive (one per line under
// Logs, whose lock admits one batch at a time; lockFreeWorkers otherwise)
// and gone once the line is empty, take the waiting calls in batches and
// hands each batch to run, which decides its calls in arrival order, each
// seeing the ones before it, in one store round (one MULTI/EXEC, or one
// lock's two round trips under Logs). A hot resource then costs one round
// trip per batch instead of one per call.
//
// A batch runs detached from its callers' contexts (it keeps the values of
// the first one's, for tracing): its deadline is the latest of theirs, and
// it is cancelled as soon as every one of its calls has given up. Each
// caller waits on its own context only, so it returns by its own deadline,
// with its own context's error, whatever the batch is doing; no caller ever
// fails because another one's context ended. A call that gives up before
// its batch decided it is recorded nowhere (a store that wrote it takes it
// back as it does a denied call); one that gives up while its batch writes
// may or may not have been counted (it can only have been counted, never
// admitted uncounted).

// maxBatch bounds the calls of one batch, and so the size of its
// MULTI/EXEC.
const maxBatch = 1024

type callState uint8

const (
	waiting   callState = iota // queued, not yet decided
	taken                      // decided by a batch whose write is under way
	abandoned                  // its caller gave up
	finished                   // res and err are final
)

// call is one AllowN waiting for a batch.
type call struct {
	ctx      context.Context
	resource string
	client   string
	n        int
	done     chan struct{} // closed once finished

	// Guarded by the batcher's mu.
	batch *batch // once taken
	state callState
	res   Result
	err   error
}

// line is the calls waiting for one place, and its workers.
type line struct {
	calls   []*call // waiting, in arrival order
	workers int     // running
	shared  shared
	lastErr error // the error of the latest batch, nil if it succeeded
}

// shared is what the batches of one line share, for the stores.
type shared struct {
	lock  lock.View // what this process knows of the lock (Logs)
	carry carried   // take-backs for the line's next transaction (round.go)
	// busy reports whether calls wait in the line: a batch after this
	// one will carry what this one hands on.
	busy func() bool
}

// batch is the calls one worker decides together.
type batch struct {
	calls  []*call
	cancel context.CancelFunc
}

// batcher holds the lines of one Bucket.
type batcher struct {
	// run decides a batch: see batch.go's opening comment.
	run func(ctx context.Context, batch []*call, sh *shared) error
	// workers is how many batches of one line may be under way at once:
	// one under a lock, more where Redis's transactions alone keep the
	// counts exact.
	workers int

	mu    sync.Mutex
	lines map[string]*line // by key

	// decision is a moving average of how long an uncontended batch takes
	// (ns), to refuse at once a batch that could not finish before the
	// latest deadline of its calls; tried is when a batch last ran (ns
	// since an arbitrary start), so that one runs at least every
	// probeEvery and the average never goes stale.
	decision atomic.Int64
	tried    atomic.Int64
}

// probeEvery is how often a batch runs even when the average says it
// cannot finish in time.
const probeEvery = 10 * time.Millisecond

// epoch is the start of the monotonic readings of batcher.tried.
var batchEpoch = time.Now()

// took records the duration of an uncontended batch.
func (q *batcher) took(d time.Duration) {
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
func (q *batcher) hopeless(ctx context.Context) error {
	deadline, ok := ctx.Deadline()
	typical := time.Duration(q.decision.Load())
	now := time.Since(batchEpoch)
	left := time.Until(deadline)
	if ok && left < typical && now-time.Duration(q.tried.Load()) < probeEvery {
		return fmt.Errorf("leakybucket: %w: %v left, and a decision takes about %v",
			context.DeadlineExceeded, left.Round(time.Microsecond), typical.Round(time.Microsecond))
	}
	q.tried.Store(int64(now))
	return nil
}

// do queues c in the line key, and returns its result once a batch
// decided it, or its context's error once it ends.
func (q *batcher) do(key string, c *call) (Result, error) {
	if c.ctx.Err() != nil {
		return Result{}, givenUp(c.ctx, false, nil) // nothing sent
	}
	c.done = make(chan struct{})
	q.mu.Lock()
	if q.lines == nil {
		q.lines = map[string]*line{}
	}
	l := q.lines[key]
	if l == nil {
		l = q.newLine()
		q.lines[key] = l
	}
	l.calls = append(l.calls, c)
	start := l.workers < max(q.workers, 1)
	if start {
		l.workers++
	}
	q.mu.Unlock()
	if start {
		go q.work(key, l)
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-c.ctx.Done():
		return q.abandon(l, c)
	}
}

func (q *batcher) newLine() *line {
	l := &line{}
	l.shared.busy = func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(l.calls) > 0
	}
	return l
}

// abandon gives c up after its context ended, and cancels the batch under
// way if no call of it is left waiting for it.
func (q *batcher) abandon(l *line, c *call) (Result, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state == finished {
		return c.res, c.err
	}
	c.state = abandoned
	if c.batch != nil && allAbandoned(c.batch.calls) {
		c.batch.cancel()
	}
	return Result{}, givenUp(c.ctx, l.shared.lock.Contended(), l.lastErr)
}

// settle gives c the result res, and reports whether its caller still
// waits for it: a call abandoned before it was decided is recorded
// nowhere.
func (q *batcher) settle(c *call, res Result) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if c.state != waiting {
		return false
	}
	c.state, c.res = taken, res
	return true
}

// fail gives each of calls the error err in place of a Result, when the
// rest of their batch was decided: the batch's finish leaves them so.
func (q *batcher) fail(calls []*call, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range calls {
		if c.state == waiting {
			c.state, c.res, c.err = taken, Result{}, err
		}
	}
}

func allAbandoned(calls []*call) bool {
	for _, c := range calls {
		if c.state != abandoned {
			return false
		}
	}
	return true
}

// givenUp is the error of a call whose context ended before its decision:
// ErrLockNotObtained if the lock was then held by another holder (real
// contention); else the context's error, with the latest batch's error if
// it failed to reach Redis (ErrUnavailable and its cause).
func givenUp(ctx context.Context, contended bool, lastErr error) error {
	cause := context.Cause(ctx)
	switch {
	case contended:
		return fmt.Errorf("%w: %w", ErrLockNotObtained, cause)
	case errors.Is(lastErr, ErrUnavailable):
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

// work runs batches of line l until it is empty.
func (q *batcher) work(key string, l *line) {
	for {
		b, ctx := q.next(key, l)
		if b == nil {
			l.shared.carry.flush() // no batch left to carry it
			return
		}
		err := q.hopeless(ctx)
		if err == nil {
			start := time.Now()
			err = q.run(ctx, b.calls, &l.shared)
			if err == nil && l.shared.lock.FreeSince(start) {
				q.took(time.Since(start))
			}
		}
		q.finish(l, b, ctx, err)
		b.cancel()
	}
}

// next takes the next batch of l, with its context; nil once l is empty:
// the worker then stops, and the last one removes l.
func (q *batcher) next(key string, l *line) (*batch, context.Context) {
	q.mu.Lock()
	defer q.mu.Unlock()
	calls := make([]*call, 0, min(len(l.calls), maxBatch))
	rest := l.calls[:0]
	for _, c := range l.calls {
		switch {
		case c.state != waiting:
		case c.ctx.Err() != nil:
			c.state = abandoned // its caller is giving up: start nothing for it
		case len(calls) < maxBatch:
			calls = append(calls, c)
		default:
			rest = append(rest, c)
		}
	}
	l.calls = rest
	if len(calls) == 0 {
		if l.workers--; l.workers == 0 {
			delete(q.lines, key)
		}
		return nil, nil
	}
	ctx, cancel := batchContext(calls)
	b := &batch{calls: calls, cancel: cancel}
	for _, c := range calls {
		c.batch = b
	}
	return b, ctx
}

// batchContext is detached from the calls' contexts, with the latest of
// their deadlines, or none if one of them has none.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	detached := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
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
func (q *batcher) finish(l *line, b *batch, ctx context.Context, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		err = givenUp(ctx, l.shared.lock.Contended(), err)
	}
	l.lastErr = err
	for _, c := range b.calls {
		if c.state == abandoned {
			continue
		}
		if err != nil {
			c.res, c.err = Result{}, err
		}
		c.state = finished
		close(c.done)
	}
}
