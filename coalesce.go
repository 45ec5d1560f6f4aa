package leakybucket

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Coalescing. Concurrent AllowN calls of one process that need the same
// lock queue behind one leader, which takes the lock once, reads the counts
// once, decides the queued calls in arrival order (each sees the calls
// admitted before it) and writes all their records in the one MULTI/EXEC
// that releases the lock. A hot resource then costs the lock's round trips
// once per batch instead of once per call, and the lock's holders across
// processes keep every decision exact.
//
// The leader's context bounds the batch. A call still waiting when its own
// context ends leaves the queue and returns ErrLockNotObtained; once its
// batch reads the counts, it waits for the batch's write (one round trip).
// If the leader's context ends before the counts are read, the calls it had
// not decided go back to the head of the queue and the first of them leads
// next; if it ends during the final write, the batch's calls share its
// error, as they share the write.

// maxBatch bounds the calls decided under one lock, and so the size of its
// MULTI/EXEC.
const maxBatch = 1024

type callState uint8

const (
	waiting   callState = iota // queued, may still leave
	taken                      // being decided by a batch
	abandoned                  // its context ended while waiting
	finished                   // res and err are final
)

// call is one AllowN waiting for a batch.
type call struct {
	ctx    context.Context
	client string
	n      int

	// Guarded by the Bucket's mu.
	state    callState
	promoted bool          // it must lead the next batch
	wake     chan struct{} // closed when finished or promoted, if not leading
	res      Result
	err      error
}

// queue is the calls waiting for one lock. It exists while a leader runs.
type queue struct{ calls []*call }

// coalescer holds the queues of one Bucket.
type coalescer struct {
	mu     sync.Mutex
	queues map[string]*queue // by lock key
}

// decide queues c for the lock lockKey, and returns its result once a batch
// decided it, leading a batch itself when it is first in line.
func (b *Bucket) decide(resource, lockKey string, c *call) (Result, error) {
	q := &b.co
	q.mu.Lock()
	if q.queues == nil {
		q.queues = map[string]*queue{}
	}
	line, busy := q.queues[lockKey]
	if !busy {
		line = &queue{}
		q.queues[lockKey] = line
	}
	line.calls = append(line.calls, c)
	c.wake = make(chan struct{})
	q.mu.Unlock()

	if busy && !b.await(c) {
		return c.res, c.err
	}
	b.lead(resource, lockKey, line, c)
	return c.res, c.err
}

// await waits until c is finished (it returns false) or must lead (true).
func (b *Bucket) await(c *call) bool {
	select {
	case <-c.wake:
	case <-c.ctx.Done():
		b.co.mu.Lock()
		if c.state == waiting && !c.promoted {
			c.state = abandoned
			c.err = fmt.Errorf("%w: %w", ErrLockNotObtained, context.Cause(c.ctx))
			b.co.mu.Unlock()
			return false
		}
		b.co.mu.Unlock()
		<-c.wake
	}
	b.co.mu.Lock()
	defer b.co.mu.Unlock()
	return c.state != finished
}

// lead runs one batch of line, led by c, and hands the queue to the next
// leader or closes it.
func (b *Bucket) lead(resource, lockKey string, line *queue, c *call) {
	q := &b.co
	q.mu.Lock()
	batch := make([]*call, 0, min(len(line.calls), maxBatch))
	rest := line.calls[:0]
	for _, w := range line.calls {
		switch {
		case w.state != waiting:
		case len(batch) < maxBatch:
			batch = append(batch, w)
		default:
			rest = append(rest, w)
		}
	}
	line.calls = rest
	q.mu.Unlock()

	err := b.runBatch(c.ctx, resource, batch)

	q.mu.Lock()
	defer q.mu.Unlock()
	var retry []*call
	for _, w := range batch {
		switch {
		case w.state == waiting && err != nil && c.ctx.Err() != nil && w != c:
			// Only the leader's context ended: not this call's error.
			retry = append(retry, w)
			continue
		case w.state == waiting || w.state == taken:
			w.state, w.err = finished, err
			if err != nil {
				w.res = Result{}
			}
		default:
			continue // abandoned: it already returned
		}
		if w != c {
			close(w.wake)
		}
	}
	line.calls = append(retry, line.calls...)
	for len(line.calls) > 0 && line.calls[0].state != waiting {
		line.calls = line.calls[1:]
	}
	if len(line.calls) == 0 {
		delete(q.queues, lockKey)
		return
	}
	next := line.calls[0]
	next.promoted = true
	close(next.wake)
}

// runBatch decides the calls of batch under one lock, all of them for the
// same lock, and records the admitted ones in its release.
func (b *Bucket) runBatch(ctx context.Context, resource string, batch []*call) error {
	clients := make([]string, 0, len(batch))
	seen := map[string]bool{}
	for _, c := range batch {
		if !seen[c.client] {
			seen[c.client] = true
			clients = append(clients, c.client)
		}
	}
	return b.locked(ctx, resource, clients, func(pipe redis.Pipeliner, keys keyspace, t *tally) {
		b.co.mu.Lock()
		for _, c := range batch {
			if c.state == waiting {
				c.state = taken
			}
		}
		b.co.mu.Unlock()
		t.sort()
		at := b.store.stamp(t.now)
		for _, c := range batch {
			if c.state != taken {
				continue
			}
			c.res = evaluate(b.plan.rules, t, c.client, at, c.n, b.cfg.recordDenied)
			if c.res.Allowed || b.cfg.recordDenied {
				b.store.record(ctx, pipe, keys, c.client, t, c.n)
				t.add(c.client, logEntry{at: at, weight: c.n})
			}
		}
	})
}
