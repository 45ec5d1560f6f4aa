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
// then Redis's, which holds one ticket per process: its first waiter's,
// scored by that waiter's arrival. Each process's waiters are in order of
// arrival, so the earliest of all is always one of those firsts: Redis's
// line is the order of arrival of every waiter, and a waiter that gives
// up before it is first here costs Redis nothing. A process's ticket
// stays in line while it has waiters, passed from each first to the
// next (its score only grows), so no process's waiter ever comes in ahead
// of a ticket already first. In Redis's line, a waiter tries only when
// it is first (others only sign of life, writing no members), and is
// woken when a release or a take-back tells it its turn came, when the
// earliest lease expires, or every ticketRefresh.
func (r *remote) waitInLine(ctx context.Context, c call) (*Lease, error) {
	st, err := r.siteOf(ctx, c.resource)
	if err != nil {
		return nil, err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return nil, st.settle(ctx, err)
	}
	until, _ := ctx.Deadline()
	w, err := r.wakes.join(ctx, st.channel(), at, until)
	if err != nil {
		return nil, joinFailed(ctx, err)
	}
	var le *Lease
	var res attemptResult
	select {
	case <-w.turn:
		le, res, err = r.waitFirst(ctx, c, w)
	case <-ctx.Done():
		err = ctx.Err()
	}
	// Admitted first in line, it knows the room it left, and whether the
	// ticket stays first for the next waiter here: that one tries at once.
	room := 0
	if le != nil {
		room = res.room - c.n
	}
	if successor, first := w.leave(room, res.nextArrival); first {
		go r.leaveLine(c.resource, w.tk, successor, res.next)
	}
	return le, err
}

// waitFirst is waitInLine once w is first in this process; it returns
// the lease, or the error, and what its last attempt learned.
func (r *remote) waitFirst(ctx context.Context, c call, w *waiter) (*Lease, attemptResult, error) {
	channel := r.spaceOf(c.resource).channel()
	tk := w.tk
	// It looks first (room is for those before it), unless the waiter
	// before it here was admitted first in line and left room for it.
	write := w.room >= c.n
	for {
		seen := r.wakes.releases(channel)
		tk.until = r.wakes.lineUntil(channel)
		le, res, err := r.attempt(ctx, c, tk, write)
		if le != nil || err != nil {
			return le, res, err
		}
		first := res.head == tk.id
		if first && !write && res.room >= c.n {
			write = true
			continue // its turn came, and its weight fits: try now
		}
		if r.wakes.first(channel, first, seen) {
			write = true
			continue // a release came while it looked
		}
		woken, err := r.sleep(ctx, w.wake, res, first)
		if err != nil {
			return nil, res, err
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

// leaveLine is what the first waiter of this process does in Redis's line
// as it leaves it (admitted, or giving up): it passes the process's
// ticket tk to successor, the next waiter here, if any (scored by its
// arrival), or drops it and tells next, the ticket after it, in the same
// transaction; and it tells whoever is first then, if another process's.
func (r *remote) leaveLine(resource string, tk, successor *ticket, next string) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	st, err := r.siteOf(ctx, resource)
	if err != nil {
		return // the ticket is dropped by others after ticketTTL
	}
	u := undo{drop: tk, tell: next}
	if successor != nil {
		u = undo{pass: successor}
	}
	if head, err := r.undo(ctx, st, u); err == nil && head != "" && head != u.tell && head != tk.id {
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
	ps     *redis.PubSub
	ticket string        // this process's ticket in Redis's line: a new one each time the line here empties
	wake   chan struct{} // for the first waiter here: a message named the ticket, or a release came while it was first
	line   []*waiter     // this process's waiters, in order of arrival
	first  bool          // the ticket was first in line when its waiter last looked
	freed  uint64        // how many release messages came
	idle   uint64        // how many times it was left without waiters
}

// A waiter is one waiter's place in its process's line.
type waiter struct {
	tk    *ticket   // its until is the process's line's (see lineUntil): only the waiter's goroutine reads or writes it
	until time.Time // the waiter's own deadline (zero if none)
	wake  <-chan struct{}
	turn  chan struct{} // closed once it is first in this process
	room  int           // set before turn is closed: the room the one before it left, if the ticket stays first
	leave func(room int, nextArrival float64) (successor *ticket, first bool)
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

// join puts a waiter last in this process's line on channel, its arrival
// stamped at (Redis ms), waiting until (zero: no deadline), subscribed
// before it returns, so that no message sent after is missed. Its turn
// comes when it is first here. Its leave takes it out, and gives the next
// its turn; it returns whether it was first, and the next one's ticket.
func (w *wakes) join(ctx context.Context, channel string, at int64, until time.Time) (*waiter, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s, err := w.subscribe(ctx, channel)
	if err != nil {
		return nil, err
	}
	if len(s.line) == 0 {
		s.ticket, s.first = newToken(), false // a late leaveLine of the one before never drops it
	}
	me := &waiter{tk: &ticket{id: s.ticket, arrival: w.arrivals.next(at)}, until: until, wake: s.wake, turn: make(chan struct{})}
	s.line = append(s.line, me)
	if len(s.line) == 1 {
		close(me.turn)
	}
	me.leave = func(room int, nextArrival float64) (*ticket, bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		successor, first := s.leave(me, room, nextArrival)
		if len(s.line) == 0 {
			s.idle++
			idle := s.idle
			time.AfterFunc(subscriptionIdle, func() { w.drop(channel, s, idle) })
		}
		return successor, first
	}
	return me, nil
}

// lineUntil is how long this process's ticket on channel is to live: as
// long as the last deadline of its waiters (zero if one has none), so
// that the process keeps its place in Redis's line while its first waiter
// gives up and the next one takes its ticket, and no longer than its
// waiters wait.
func (w *wakes) lineUntil(channel string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil {
		return s.until()
	}
	return time.Time{}
}

// until is lineUntil's, for s; the wakes' mu is held.
func (s *subscription) until() time.Time {
	var last time.Time
	for _, me := range s.line {
		if me.until.IsZero() {
			return time.Time{}
		}
		if me.until.After(last) {
			last = me.until
		}
	}
	return last
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
	s := &subscription{ps: ps, wake: make(chan struct{}, 1)}
	w.subs[channel] = s
	go w.dispatch(s)
	return s, nil
}

// leave takes me out of s's line; if me was first, the next one's turn
// comes (a wake meant for me is not its), with the room me left if the
// ticket, scored by the next one's arrival, stays ahead of nextArrival's,
// and its ticket is returned; the wakes' mu is held.
func (s *subscription) leave(me *waiter, room int, nextArrival float64) (successor *ticket, first bool) {
	i := slices.Index(s.line, me)
	if i < 0 {
		return nil, false
	}
	s.line = slices.Delete(s.line, i, i+1)
	if i > 0 {
		return nil, false
	}
	if len(s.line) == 0 {
		return nil, true
	}
	select {
	case <-s.wake:
	default:
	}
	next := s.line[0]
	if next.tk.arrival < nextArrival {
		next.room = room
	}
	passed := *next.tk // for the leaver's goroutine: next's own is next's
	passed.until = s.until()
	close(next.turn)
	return &passed, true
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

// first records whether this process's ticket on channel was first in
// line when its waiter last looked, so that a release's message wakes
// it; it reports whether, first, a release came since seen (releases
// before the look), which the look may have missed.
func (w *wakes) first(channel string, first bool, seen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	if s == nil {
		return false
	}
	s.first = first
	return first && s.freed != seen
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
	if len(s.line) == 0 && s.idle == idle && w.subs[channel] == s {
		delete(w.subs, channel)
		_ = s.ps.Close()
	}
}

// dispatch wakes this process's first waiter on s when a message names
// its ticket, or is empty (a release) while it was first, until s is
// closed.
func (w *wakes) dispatch(s *subscription) {
	for msg := range s.ps.Channel() {
		w.mu.Lock()
		if msg.Payload == "" {
			s.freed++
		}
		if msg.Payload == s.ticket || (msg.Payload == "" && s.first) {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}
