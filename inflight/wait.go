package inflight

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// acquire makes one attempt at once, unless this process has waiters
// for the resource already (the newcomer would only be refused for
// them); then, if wait, waits in line.
func (r *remote) acquire(ctx context.Context, c call, wait bool) (*Lease, error) {
	if !wait || !r.wakes.busy(r.spaceOf(c.resource).channel()) {
		le, _, err := r.attempt(ctx, c, nil, true)
		if le != nil || err != nil || !wait {
			return le, err
		}
	}
	return r.waitInLine(ctx, c)
}

// waitInLine waits for its turn in two lines: this process's, in memory,
// then, once first in it, Redis's, which holds the first waiter of each
// process only. Each process's waiters are in order of arrival, so the
// earliest of all is always one of those firsts: the line in Redis is
// the order of arrival of every waiter, and a waiter that gives up
// before it is first here costs Redis nothing. In Redis's line, a waiter
// tries only when it is first (others only sign of life, writing no
// members), and is woken when a release or a take-back tells it its turn
// came, when the earliest lease expires, or every ticketRefresh.
func (r *remote) waitInLine(ctx context.Context, c call) (*Lease, error) {
	st, err := r.siteOf(ctx, c.resource)
	if err != nil {
		return nil, err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return nil, st.settle(ctx, err)
	}
	tk := &ticket{id: newToken()}
	tk.until, _ = ctx.Deadline()
	w, err := r.wakes.join(ctx, st.channel(), tk, at)
	if err != nil {
		return nil, joinFailed(ctx, err)
	}
	defer w.leave()
	select {
	case <-w.turn:
	case <-ctx.Done():
		return nil, ctx.Err() // it never was in Redis's line: nothing to undo
	}
	return r.waitFirst(ctx, c, tk, w)
}

// waitFirst is waitInLine once tk's waiter is first in this process.
func (r *remote) waitFirst(ctx context.Context, c call, tk *ticket, w *waiter) (*Lease, error) {
	channel := r.spaceOf(c.resource).channel()
	write := false // it looks first: room is for those before it
	for {
		seen := r.wakes.releases(channel)
		le, res, err := r.attempt(ctx, c, tk, write)
		switch {
		case le != nil:
			go r.leaveLine(c.resource, tk, res.next)
			return le, nil
		case err != nil:
			go r.leaveLine(c.resource, tk, "")
			return nil, err
		}
		first := res.head == tk.id
		if first && !write && res.room >= c.n {
			write = true
			continue // its turn came, and its weight fits: try now
		}
		if r.wakes.first(channel, tk.id, first, seen) {
			write = true
			continue // a release came while it looked
		}
		woken, err := r.sleep(ctx, w.wake, res, first)
		if err != nil {
			go r.leaveLine(c.resource, tk, "")
			return nil, err
		}
		write = first || woken // a waiter is woken when its turn came
	}
}

// sleep waits until wake, the earliest lease's deadline if first, the
// next sign of life, or ctx's end; woken if wake came.
func (r *remote) sleep(ctx context.Context, wake <-chan struct{}, res attemptResult, first bool) (woken bool, err error) {
	d := ticketRefresh
	if until := time.Duration(res.earliest-res.now+1) * time.Millisecond; first && res.earliest > 0 && until < d {
		d = max(until, time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true, nil
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// leaveLine drops tk from the line and tells the next waiter (next, in
// the same transaction, if known; and whoever is first after it, if
// another): after an admission, or when the waiter gave up.
func (r *remote) leaveLine(resource string, tk *ticket, next string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	st, err := r.siteOf(ctx, resource)
	if err != nil {
		return // the ticket is dropped by others after ticketTTL
	}
	if head, err := r.undo(ctx, st, undo{drop: tk, tell: next}); err == nil && head != "" && head != next {
		_ = st.node.Publish(ctx, st.channel(), head).Err()
	}
}

// wakes is this process's waiters, by channel: one subscription per
// resource with waiters, whose messages name the ticket whose turn came,
// or are empty after a release: for the first in line, whoever it is.
type wakes struct {
	rdb      redis.UniversalClient
	mu       sync.Mutex // guards subs
	subs     map[string]*subscription
	arrivals arrivals
}

type subscription struct {
	ps      *redis.PubSub
	waiters map[string]chan struct{} // by ticket
	line    []*waiter                // this process's waiters, in order of arrival
	head    string                   // the ticket of the waiter here that was first in line when it last looked
	freed   uint64                   // how many release messages came
	idle    uint64                   // how many times it was left without waiters
}

// A waiter is one waiter's place in its process's line.
type waiter struct {
	wake  <-chan struct{} // a message named its ticket, or a release came while it was first
	turn  chan struct{}   // closed once it is first in this process
	leave func()          // out of this process's line: the next one's turn
}

func newWakes(rdb redis.UniversalClient) *wakes {
	return &wakes{rdb: rdb, subs: map[string]*subscription{}}
}

// busy reports whether this process has waiters on channel.
func (w *wakes) busy(channel string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	return s != nil && len(s.line) > 0
}

// behind returns how many of this process's waiters on channel wait
// behind its first, out of Redis's line.
func (w *wakes) behind(channel string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil && len(s.line) > 1 {
		return len(s.line) - 1
	}
	return 0
}

// join puts tk's waiter last in this process's line on channel, its
// arrival stamped at (Redis ms), subscribed before it returns, so that no
// message sent after is missed. Its turn comes when it is first here.
func (w *wakes) join(ctx context.Context, channel string, tk *ticket, at int64) (*waiter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, err := w.subscribe(ctx, channel)
	if err != nil {
		return nil, err
	}
	tk.arrival = w.arrivals.next(at)
	ch := make(chan struct{}, 1)
	s.waiters[tk.id] = ch
	me := &waiter{wake: ch, turn: make(chan struct{})}
	s.line = append(s.line, me)
	if len(s.line) == 1 {
		close(me.turn)
	}
	me.leave = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(s.waiters, tk.id)
		if s.head == tk.id {
			s.head = ""
		}
		s.leave(me)
		if len(s.waiters) == 0 {
			s.idle++
			idle := s.idle
			time.AfterFunc(subscriptionIdle, func() { w.drop(channel, s, idle) })
		}
	}
	return me, nil
}

// subscribe returns channel's subscription, made if missing; w.mu is held.
func (w *wakes) subscribe(ctx context.Context, channel string) (*subscription, error) {
	if s := w.subs[channel]; s != nil {
		return s, nil
	}
	if ring, ok := w.rdb.(*redis.Ring); ok {
		if _, err := ring.GetShardClientForKey(channel); err != nil {
			return nil, err // Ring.Subscribe would panic
		}
	}
	ps := w.rdb.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, err
	}
	s := &subscription{ps: ps, waiters: map[string]chan struct{}{}}
	w.subs[channel] = s
	go w.dispatch(s)
	return s, nil
}

// leave takes me out of s's line, and gives the next its turn if me was
// first; the wakes' mu is held.
func (s *subscription) leave(me *waiter) {
	i := slices.Index(s.line, me)
	if i < 0 {
		return
	}
	s.line = slices.Delete(s.line, i, i+1)
	if i == 0 && len(s.line) > 0 {
		close(s.line[0].turn)
	}
}

// joinFailed is the error of a waiter that could not join its line: a
// subscription whose reply came later than the waiter would wait is the
// wait running out (outOfTime), not an outage.
func joinFailed(ctx context.Context, err error) error {
	if late := outOfTime(ctx, err); late != nil {
		return late
	}
	return classify(err)
}

// releases returns how many release messages came on channel, for first.
func (w *wakes) releases(channel string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil {
		return s.freed
	}
	return 0
}

// first records whether ticket's waiter was first in line when it last
// looked, so that a release's message wakes it; it reports whether a
// release came since seen (releases before the look), which the look
// may have missed.
func (w *wakes) first(channel, ticket string, first bool, seen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	switch {
	case s == nil:
		return false
	case first:
		s.head = ticket
		return s.freed != seen
	case s.head == ticket:
		s.head = ""
	}
	return false
}

// subscriptionIdle is how long a subscription outlives its last waiter:
// waiters that come and go (short waits under contention) would
// otherwise dial and subscribe for each.
const subscriptionIdle = time.Second

// drop closes s unless a waiter came since it became idle for the idle-th
// time.
func (w *wakes) drop(channel string, s *subscription, idle uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(s.waiters) == 0 && s.idle == idle && w.subs[channel] == s {
		delete(w.subs, channel)
		_ = s.ps.Close()
	}
}

// dispatch wakes the waiter that each message names (the first in line
// for an empty one), until s is closed.
func (w *wakes) dispatch(s *subscription) {
	for msg := range s.ps.Channel() {
		w.mu.Lock()
		ticket := msg.Payload
		if ticket == "" {
			ticket = s.head
			s.freed++
		}
		if ch := s.waiters[ticket]; ch != nil {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}
