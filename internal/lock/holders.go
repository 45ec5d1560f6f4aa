package lock

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Holders bound how many decisions of this process take locks of one
// server at once. A lock's lifetime starts when its SET is sent; a holder
// that then waits for one of the client's pooled connections, or behind a
// thousand other transactions queued in Redis, spends that lifetime
// waiting and can outlive its lock without being slow itself. So a
// decision takes a turn first, with its callers' context, and only then
// the lock: a crowd of lines waits in this process, where the wait costs
// no lock anything, and the few holders at a time each find a connection
// free and Redis quick to answer. Turns are handed out in arrival order
// (a Go channel's waiters queue in order), so no line starves.
type Holders struct {
	m sync.Map // address -> chan struct{}, its turns
}

// turns returns the turns of node's server: a quarter of its pool (at
// least one), which leaves the rest to the application, to the background
// releases and to Peek; more holders at once only queue in Redis, each
// spending its lock's lifetime there (measured with a thousand lines on
// miniredis: a half let decisions outlive their 2 s locks).
func (h *Holders) turns(node *redis.Client) chan struct{} {
	opt := node.Options()
	if ch, ok := h.m.Load(opt.Addr); ok {
		return ch.(chan struct{})
	}
	ch, _ := h.m.LoadOrStore(opt.Addr, make(chan struct{}, max(1, opt.PoolSize/4)))
	return ch.(chan struct{})
}

// take waits for a turn on node's server until ctx ends, and returns the
// function that gives it back.
func (h *Holders) take(ctx context.Context, node *redis.Client) (func(), error) {
	if h == nil {
		return func() {}, nil
	}
	turns := h.turns(node)
	select {
	case turns <- struct{}{}:
		return func() { <-turns }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}
