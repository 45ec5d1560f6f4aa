package inflight

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// acquire makes one attempt at once, unless it would wait, and this
// process has waiters for the resource already, or its view of the line
// says it would not fit behind them (it would only be refused); then, if
// wait, waits in line.
func (r *remote) acquire(ctx context.Context, c call, wait bool) (*Lease, error) {
	if !wait || !r.wakes.behindAll(r.spaceOf(c.resource).channel(), c.n) {
		le, _, err := r.attempt(ctx, c, nil, true)
		if le != nil || err != nil || !wait {
			return le, err
		}
	}
	return r.waitInLine(ctx, c)
}

// waitInLine waits for its turn in two lines: this process's, in memory,
// then Redis's, which holds one ticket per process: its first waiter's,
// scored by that waiter's arrival, with its weight. Each process's
// waiters are in order of arrival, so the earliest of all is always one
// of those firsts, and a waiter that gives up before it is first here
// costs Redis nothing. A process's ticket stays in line while it has
// waiters, passed from each first to the next (its score only grows). In
// Redis's line, a waiter takes room when what is free fits its weight
// behind the tickets ahead of it: it tries when this process's view of
// the line says so (see view), and looks when it has no view, or every
// ticketRefresh, or when the earliest lease expires.
func (r *remote) waitInLine(ctx context.Context, c call) (*Lease, error) {
	st, err := r.siteOf(ctx, c.resource)
	if err != nil {
		return nil, err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return nil, st.settle(ctx, err)
	}
	// Its arrival is the clock's best estimate, to the microsecond, not
	// the stamp: earlier by the estimate's error, the stamp would put a
	// process whose round trips are slower ahead; and to the millisecond,
	// arrivals of several processes in one millisecond would tie, and a
	// tie goes to the ticket whose name sorts first, the same process's
	// for as long as its waiters keep its ticket.
	arrival := float64(at)
	if fine, ok := st.clock.Fine(); ok {
		arrival = fine
	}
	until, _ := ctx.Deadline()
	w, err := r.wakes.join(ctx, st.channel(), arrival, c.n, until)
	if err != nil {
		return nil, joinFailed(ctx, err)
	}
	var le *Lease
	select {
	case <-w.turn:
		le, err = r.waitFirst(ctx, c, w, st.cut)
	case <-ctx.Done():
		err = ctx.Err()
	}
	// The next waiter here inherits this process's view of the line.
	took := 0
	if le != nil {
		took = c.n
	}
	if successor, first := w.leave(took); first {
		go r.leaveLine(c.resource, move{from: r.wakes.id, id: w.tk.id, to: placedOf(successor)}, successor)
	}
	return le, err
}

// placedOf is tk's place in line, nil if tk is.
func placedOf(tk *ticket) *placed {
	if tk == nil {
		return nil
	}
	return &placed{id: tk.id, arrival: tk.arrival, weight: tk.weight}
}

// waitFirst is waitInLine once w is first in this process. It takes
// room only when this process's view of the line says its weight fits
// behind the tickets ahead of it, and looks (an attempt that writes
// nothing) when there is no view, or the view cannot tell.
func (r *remote) waitFirst(ctx context.Context, c call, w *waiter, cut <-chan struct{}) (*Lease, error) {
	channel := r.spaceOf(c.resource).channel()
	tk := w.tk
	var res attemptResult
	for {
		write, known := r.wakes.reckon(channel, tk)
		for known && !write { // the view says it does not fit: wait for news
			woken, err := r.sleep(ctx, w.wake, cut, res)
			if err != nil {
				return nil, err
			}
			if !woken {
				break // its timer: it looks, to sign of life and to notice expiries
			}
			write, known = r.wakes.reckon(channel, tk)
		}
		tk.until = r.wakes.lineUntil(channel)
		le, last, err := r.attempt(ctx, c, tk, write)
		if err != nil {
			r.wakes.unanswered(channel)
			return nil, err
		}
		res = last
		r.wakes.looked(channel, res) // admitted, its view is the next waiter's here, less what it took
		if le != nil {
			return le, nil
		}
	}
}

// sleep waits until wake, the earliest lease's deadline, the next sign
// of life, or ctx's end; woken if wake came. A server found gone (cut:
// the breaker opened) wakes it too, not woken: its next attempt says so
// at once rather than at its next sign of life.
func (r *remote) sleep(ctx context.Context, wake, cut <-chan struct{}, res attemptResult) (woken bool, err error) {
	d := ticketRefresh
	if until := time.Duration(res.earliest-res.now+1) * time.Millisecond; res.earliest > 0 && until < d {
		d = max(until, time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return true, nil
	case <-t.C:
		return false, nil
	case <-cut:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// leaveLine is what the first waiter of this process does in Redis's line
// as it leaves it (admitted, or giving up): it passes the process's
// ticket to successor, the next waiter here, if any (scored by its
// arrival and weight), or drops it, and tells every process of the move,
// in one transaction.
func (r *remote) leaveLine(resource string, m move, successor *ticket) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	st, err := r.siteOf(ctx, resource)
	if err != nil {
		return // the ticket is dropped by others after ticketTTL
	}
	u := undo{drop: m.id, tell: m.String()}
	if successor != nil {
		u = undo{pass: successor, tell: m.String()}
	}
	_ = r.undo(ctx, st, u)
}

// wakes is this process's waiters, by channel: one subscription per
// resource with waiters, whose messages name the ticket whose turn came,
// or are empty after a release: for the first in line, whoever it is.
type wakes struct {
	id       string // this process's, in the moves it sends
	rdb      redis.UniversalClient
	mu       sync.Mutex // guards subs
	subs     map[string]*subscription
	arrivals arrivals
}

type subscription struct {
	ready  chan struct{} // closed once ps is subscribed, or err says why not
	err    error
	ps     *redis.PubSub
	ticket string        // this process's ticket in Redis's line: a new one each time the line here empties
	wake   chan struct{} // for the first waiter here: a message named the ticket, or a release came while it was first
	line   []*waiter     // this process's waiters, in order of arrival
	inLine bool          // the ticket is in Redis's line: its first waiter has looked
	view   *view         // this process's view of the line, nil if none
	next   *pendingView  // the view of the first waiter's attempt under way, if any
	seq    uint64        // the number of its last attempt
	idle   uint64        // how many times it was left without waiters
}

// A waiter is one waiter's place in its process's line.
type waiter struct {
	tk    *ticket   // its until is the process's line's (see lineUntil): only the waiter's goroutine reads or writes it
	until time.Time // the waiter's own deadline (zero if none)
	wake  <-chan struct{}
	turn  chan struct{} // closed once it is first in this process
	leave func(took int) (successor *ticket, first bool)
}

func newWakes(rdb redis.UniversalClient) *wakes {
	return &wakes{rdb: rdb, subs: map[string]*subscription{}, id: newToken()}
}

// behindAll reports whether this process has waiters on channel, or its
// view of the line there says weight n does not fit behind every ticket.
func (w *wakes) behindAll(channel string, n int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	if s == nil {
		return false
	}
	v := s.latest()
	return len(s.line) > 0 || (v != nil && !v.fits("", math.Inf(1), n))
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
func (w *wakes) join(ctx context.Context, channel string, at float64, n int, until time.Time) (*waiter, error) {
	for {
		s, err := w.ready(ctx, channel)
		if err != nil {
			return nil, err
		}
		w.mu.Lock()
		if w.subs[channel] == s { // not dropped while idle since it was ready
			defer w.mu.Unlock()
			return w.enter(channel, s, at, n, until), nil
		}
		w.mu.Unlock()
	}
}

// ready returns channel's subscription once it is ready, or the error
// that kept it from being, or ctx's.
func (w *wakes) ready(ctx context.Context, channel string) (*subscription, error) {
	s, err := w.subscription(channel)
	if err != nil {
		return nil, err
	}
	select {
	case <-s.ready:
		return s, s.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// enter puts a waiter last in s's line (see join); w.mu is held.
func (w *wakes) enter(channel string, s *subscription, at float64, n int, until time.Time) *waiter {
	if len(s.line) == 0 {
		s.ticket, s.inLine = newToken(), false // a late leaveLine of the one before never drops it
	}
	me := &waiter{tk: &ticket{id: s.ticket, arrival: w.arrivals.next(at), weight: n}, until: until, wake: s.wake, turn: make(chan struct{})}
	s.line = append(s.line, me)
	if len(s.line) == 1 {
		close(me.turn)
	}
	me.leave = func(took int) (*ticket, bool) {
		w.mu.Lock()
		defer w.mu.Unlock()
		successor, first := s.leave(me, took)
		if len(s.line) == 0 {
			w.idle(channel, s)
		}
		return successor, first
	}
	return me
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

// subscription returns channel's subscription, which is being made if
// it was missing: its ready is closed once it is subscribed, or failed.
// It is made on a context of its own, so that a waiter that gives up
// before it is ready leaves it to the next (under short waits and a
// loaded host, a subscription made within each waiter's wait might
// never be ready), and unlocked, so that a slow server holds up no other
// resource's waiters.
func (w *wakes) subscription(channel string) (*subscription, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil {
		return s, nil
	}
	if ring, ok := w.rdb.(*redis.Ring); ok {
		if _, err := ring.GetShardClientForKey(channel); err != nil {
			return nil, err // Ring.Subscribe would panic
		}
	}
	s := &subscription{wake: make(chan struct{}, 1), ready: make(chan struct{})}
	w.subs[channel] = s
	go w.open(channel, s)
	return s, nil
}

// open subscribes s to channel, within subscribeTimeout, and readies it;
// a subscription that failed is forgotten, for the next waiter to make
// anew, and one that no waiter waits for any more is dropped once idle.
func (w *wakes) open(channel string, s *subscription) {
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	ps := w.rdb.Subscribe(ctx, channel)
	_, err := ps.Receive(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	defer close(s.ready)
	if err != nil {
		_ = ps.Close()
		s.err = err
		delete(w.subs, channel)
		return
	}
	s.ps = ps
	go w.dispatch(s)
	if len(s.line) == 0 {
		w.idle(channel, s)
	}
}

// subscribeTimeout bounds the making of a subscription.
const subscribeTimeout = time.Second

// idle schedules s's drop, as it has no waiter; w.mu is held.
func (w *wakes) idle(channel string, s *subscription) {
	s.idle++
	idle := s.idle
	time.AfterFunc(subscriptionIdle, func() { w.drop(channel, s, idle) })
}

// leave takes me out of s's line; if me was first, the next one's turn
// comes (a wake meant for me is not its), and its ticket, which takes
// me's place in the view, is returned; the view, which stays for the
// next waiters and newcomers (see acquire), takes what me took. The
// wakes' mu is held.
func (s *subscription) leave(me *waiter, took int) (successor *ticket, first bool) {
	i := slices.Index(s.line, me)
	if i < 0 {
		return nil, false
	}
	s.line = slices.Delete(s.line, i, i+1)
	if i > 0 {
		return nil, false
	}
	if len(s.line) > 0 {
		select {
		case <-s.wake:
		default:
		}
		passed := *s.line[0].tk // for the leaver's goroutine: next's own is next's
		passed.until = s.until()
		successor = &passed
		close(s.line[0].turn)
	}
	if v := s.latest(); v != nil {
		v.room -= took // its write's message is its own: the view did not count it
		v.moved(move{id: me.tk.id, to: placedOf(successor)})
	}
	return successor, true
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

// looking records that this process's first waiter on channel starts an
// attempt, and returns the attempt's number, which its message carries:
// until the attempt's reply and its message are both in, the view waits.
func (w *wakes) looking(channel string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.subs[channel]
	if s == nil {
		return 0
	}
	s.seq++
	s.next = &pendingView{seq: s.seq}
	return s.seq
}

// A pendingView is an attempt's, under way: its reply's view, once in,
// and the messages heard after the attempt's own.
type pendingView struct {
	seq   uint64
	heard bool // its own message came
	view  *view
	after []string
}

// looked records that this process's ticket on channel is in Redis's
// line, so that messages wake its first waiter (see hear), and the view of
// the line its first waiter's attempt saw.
func (w *wakes) looked(channel string, res attemptResult) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil && s.next != nil {
		s.inLine, s.next.view = true, viewOf(res)
		s.settle(w.id)
	}
}

// unanswered records that the attempt under way on channel got no
// reply: its message may never come, and the messages before it were
// not applied, so there is no view until the next look.
func (w *wakes) unanswered(channel string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil {
		s.view, s.next = nil, nil
	}
}

// settle makes the pending view s's view once both its reply and its
// message are in; the wakes' mu is held.
func (s *subscription) settle(self string) {
	p := s.next
	if p == nil || p.view == nil || !p.heard {
		return
	}
	s.view, s.next = p.view, nil
	for _, msg := range p.after {
		s.hear(msg, self)
	}
}

// reckon reports whether this process's view of the line on channel says
// that tk's weight fits: known is false if there is no view.
func (w *wakes) reckon(channel string, tk *ticket) (write, known bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s := w.subs[channel]; s != nil {
		return s.reckon(tk)
	}
	return false, false
}

// heard takes msg, heard on s's channel: while an attempt is under way,
// the messages before its own are in its reply already, and those after
// wait for it; else msg goes to the view. It reports whether the first
// waiter is to reckon again (see hear). The wakes' mu is held.
func (s *subscription) heard(msg, self string) (news bool) {
	p := s.next
	switch {
	case p == nil:
		return s.hear(msg, self)
	case p.heard:
		p.after = append(p.after, msg)
	default:
		if m, ok := parseAttempt(msg); ok && m.from == self && m.seq == p.seq {
			p.heard = true
			s.settle(self)
			return true
		}
	}
	return false
}

// hear applies msg, heard on s's channel, to s's view; self is this
// process's id: its own writes are in the view already (see leave). A
// take-back leaves no view: the first waiter looks. It reports whether
// the waiter may now fit where it did not: room came (a release), the
// line moved, or the view is gone; a write or a look only takes room or
// changes nothing, and wakes no one. The wakes' mu is held.
func (s *subscription) hear(msg, self string) (news bool) {
	if s.view == nil {
		return true
	}
	if msg == takenBack {
		s.view = nil
		return true
	}
	if m, ok := parseMove(msg); ok {
		s.view.moved(m) // its own too: a look since may have seen the ticket still in place
		return true
	}
	if m, ok := parseAttempt(msg); ok {
		if m.from != self || m.seq == 0 { // a newcomer's write here is no waiter's (see leave)
			s.view.room -= m.n
		}
		return false
	}
	if n, err := strconv.Atoi(msg); err == nil {
		s.view.room += n
	}
	return true
}

// latest is s's latest view: the pending one if its reply is in, else
// the settled one (nil if none); the wakes' mu is held.
func (s *subscription) latest() *view {
	if s.next != nil && s.next.view != nil {
		return s.next.view
	}
	return s.view
}

// reckon is wakes.reckon, for s; the wakes' mu is held. While an
// attempt's view is pending, the waiter waits for it.
func (s *subscription) reckon(tk *ticket) (write, known bool) {
	if !s.inLine {
		return false, false // a new ticket: in Redis's line only once it tries
	}
	if s.next != nil {
		return false, true
	}
	if s.view == nil {
		return false, false
	}
	return s.view.fits(tk.id, tk.arrival, tk.weight), true
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

// dispatch brings this process's view of the line on s up to date with
// every message, and wakes its first waiter, once its ticket is in line,
// until s is closed.
func (w *wakes) dispatch(s *subscription) {
	for msg := range s.ps.Channel() {
		w.mu.Lock()
		if s.heard(msg.Payload, w.id) && s.inLine {
			select {
			case s.wake <- struct{}{}:
			default:
			}
		}
		w.mu.Unlock()
	}
}
