package inflight

import (
	"context"
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

// waitInLine takes a ticket and waits for its turn: a waiter tries only
// when it is first in line (others only sign of life, writing no
// members), and is woken when a release or a take-back tells it its turn
// came, when the earliest lease expires, or every ticketRefresh.
func (r *remote) waitInLine(ctx context.Context, c call) (*Lease, error) {
	tk := &ticket{id: newToken()}
	tk.until, _ = ctx.Deadline()
	channel := r.spaceOf(c.resource).channel()
	wake, leave, err := r.wakes.join(ctx, channel, tk.id)
	if err != nil {
		return nil, joinFailed(ctx, err)
	}
	defer leave()
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
		if first && !write {
			write = true
			continue // its turn came: try now
		}
		if r.wakes.first(channel, tk.id, first, seen) {
			write = true
			continue // a release came while it looked
		}
		woken, err := r.sleep(ctx, wake, res, first)
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
	rdb  redis.UniversalClient
	mu   sync.Mutex // guards subs
	subs map[string]*subscription
}

type subscription struct {
	ps      *redis.PubSub
	waiters map[string]chan struct{} // by ticket
	head    string                   // the ticket of the waiter here that was first in line when it last looked
	freed   uint64                   // how many release messages came
	idle    uint64                   // how many times it was left without waiters
}

func newWakes(rdb redis.UniversalClient) *wakes {
	return &wakes{rdb: rdb, subs: map[string]*subscription{}}
}

// busy reports whether this process has waiters on channel.
func (w *wakes) busy(channel string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	return s != nil && len(s.waiters) > 0
}

// join registers ticket's waiter on channel, subscribed before it
// returns, so that no message sent after is missed. leave undoes it.
func (w *wakes) join(ctx context.Context, channel, ticket string) (<-chan struct{}, func(), error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	if s == nil {
		if ring, ok := w.rdb.(*redis.Ring); ok {
			if _, err := ring.GetShardClientForKey(channel); err != nil {
				return nil, nil, err // Ring.Subscribe would panic
			}
		}
		ps := w.rdb.Subscribe(ctx, channel)
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			return nil, nil, err
		}
		s = &subscription{ps: ps, waiters: map[string]chan struct{}{}}
		w.subs[channel] = s
		go w.dispatch(s)
	}
	ch := make(chan struct{}, 1)
	s.waiters[ticket] = ch
	leave := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(s.waiters, ticket)
		if s.head == ticket {
			s.head = ""
		}
		if len(s.waiters) == 0 {
			s.idle++
			idle := s.idle
			time.AfterFunc(subscriptionIdle, func() { w.drop(channel, s, idle) })
		}
	}
	return ch, leave, nil
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
