// Package clock estimates the time of a Redis server from this host.
//
// A decision stamps its calls with the server's time, read from an
// estimate rather than a TIME round trip, and a lock is given an absolute
// deadline in the server's clock (SET ... PXAT): both need the server's
// time without asking for it. The host's wall clock is never used, so a
// skewed host clock changes nothing.
package clock

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Clock estimates the time of one Redis server. The zero Clock is ready;
// it is safe for concurrent use.
//
// A relative deadline (PX) counts from when Redis runs the command, which
// after a pause (SIGSTOP, a long fork, a failover) can be long after the
// caller gave up; a stamp or deadline from the estimate says when the
// caller meant.
//
// Each sample is a TIME reply together with the host's monotonic clock
// before the request and after the reply: the server's time was read
// somewhere in between, so the estimate at the midpoint is off by at most
// half the round trip. The sample with the shortest round trip is kept,
// and replaced by a newer one with a round trip at most about four times
// as long once it is older than sampleAge (clock drift is parts per
// million, so minutes-old samples would do too); a reply delayed by a
// pause is not taken unless there is nothing better.
//
// A clock that does not move (miniredis after SetTime, in tests) would
// make the estimate run ahead of it: once a request sent a millisecond or
// more after an earlier reply arrived reads the same microsecond, which no
// running clock does, the clock is taken for a test's (PaceStopped), and
// the estimate is the latest reply from then on.
type Clock struct {
	mu     sync.Mutex
	valid  bool
	server time.Time     // Redis time (to the µs) at the midpoint of the sample
	at     time.Time     // the host's monotonic reading at that midpoint
	rtt    time.Duration // the sample's round trip: the estimate's error is at most half of it

	last    time.Time // the latest reply, whether taken as the sample or not
	lastAt  time.Time // when the first reply of last's time arrived
	anchor  time.Time // a reply that the pace is judged against
	asked   time.Time // when the anchor's request was sent
	sinceAt time.Time // when the anchor arrived
	stopped bool      // the server's clock was seen standing still: a test's
	running bool      // the server's clock was seen moving at this host's pace
}

const sampleAge = 10 * time.Second

// Observe records a TIME reply (server) read between sent and received.
func (c *Clock) Observe(server time.Time, sent, received time.Time) {
	rtt := received.Sub(sent)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Sent a millisecond or more after a reply of the same time arrived,
	// this request was read by the server that much later: a running
	// clock cannot read the same.
	if server.Equal(c.last) {
		c.stopped = c.stopped || sent.Sub(c.lastAt) >= time.Millisecond
	} else {
		c.last, c.lastAt = server, received
	}
	c.checkPace(server, sent, received)
	if c.valid && rtt > c.rtt && !(time.Since(c.at) > sampleAge && rtt <= 4*c.rtt+time.Millisecond) {
		return // a worse sample: a round trip slowed by load or a pause
	}
	c.valid, c.server, c.at, c.rtt = true, server, sent.Add(rtt/2), rtt
}

// checkPace compares a reply with the anchor, an earlier one: a request
// sent a millisecond or more after the anchor arrived was read by the
// server that much later at least, and at most as long after the anchor's
// request was sent as its own reply took to arrive; a clock
// that moved by as much as this host's did, within a millisecond, runs. A
// test's clock, which stands still or jumps, does not. The anchor moves to
// each reply so checked; replies sent sooner are not checked, so that a
// Bucket hammered from its first call, which sends each request as the
// last reply arrives, sees its clock run too. c.mu is held.
func (c *Clock) checkPace(server time.Time, sent, received time.Time) {
	if c.sinceAt.IsZero() {
		c.anchor, c.asked, c.sinceAt = server, sent, received
		return
	}
	least, most := sent.Sub(c.sinceAt), received.Sub(c.asked)
	if least < time.Millisecond {
		return
	}
	moved := server.Sub(c.anchor)
	if moved >= least-time.Millisecond && moved <= most+time.Millisecond {
		c.running = c.running || !c.stopped
	}
	c.anchor, c.asked, c.sinceAt = server, sent, received
}

// Now returns the server's estimated time in ms, and false until a sample
// was observed.
func (c *Clock) Now() (int64, bool) { return c.estimate(0) }

// Fine is Now to the microsecond, in ms: to order events within one
// millisecond, where Now would tie them.
func (c *Clock) Fine() (float64, bool) {
	t, ok := c.when(0)
	if !ok {
		return 0, false
	}
	return float64(t.UnixMicro()) / 1000, true
}

// Set holds one Clock per server address (a cluster's masters may
// disagree).
type Set struct{ m sync.Map }

// Of returns the Clock of the server at addr.
func (cs *Set) Of(addr string) *Clock {
	c, _ := cs.m.LoadOrStore(addr, &Clock{})
	return c.(*Clock)
}

// Reset forgets the sample, after the server's clock was seen to disagree
// with the estimate: the next reply is taken as the new sample.
func (c *Clock) Reset() {
	c.mu.Lock()
	c.valid = false
	c.mu.Unlock()
}

// LagLimit bounds how far behind Redis's time a decision's stamp may be
// when it is judged, whatever its round trip: one that ran later is taken
// back and made again. The keys that a decision reads at its stamp rather
// than at Redis's time (SortedSet's sets, a fixed window's hash) outlive
// their newest call's window by as much, so that their expiry never hides
// from a judged decision a call it counts (the design notes, "Expiry").
const LagLimit = time.Second

// Jump is how far a TIME reply may stray from the estimate before the
// estimate is thrown away: the server's clock was set, or a failover put
// another host behind the address.
const Jump = 50 * time.Millisecond

// Estimate returns the server's time in ms: the estimate, or, before the
// first sample, a TIME round trip's reply.
//
// It is the estimate less its error, so that it is never later than the
// server's time: a call stamped later than it was made would stay in its
// windows too long, and its Result would say so.
func (c *Clock) Estimate(ctx context.Context, node *redis.Client) (int64, error) {
	if now, ok := c.Earliest(); ok {
		return now, nil
	}
	sent := time.Now()
	t, err := node.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	c.Observe(t, sent, time.Now())
	now, _ := c.Earliest()
	return now, nil
}

// Earliest is Now less the estimate's error.
func (c *Clock) Earliest() (int64, bool) { return c.estimate(-1) }

// Expected is when a transaction sent now is expected to run, by the
// server's clock, in ms: the estimate plus half the sample's round trip,
// the request's way there. It may be later than the server's time by the
// estimate's error, so only a score that is checked against the
// transaction's TIME, and made right where it is off, may use it. Until
// the clock was seen running it is Earliest, so that a test's clock,
// which stands or jumps, reads the same.
func (c *Clock) Expected() (int64, bool) {
	if c.Pace() != PaceRunning {
		return c.Earliest()
	}
	return c.estimate(1)
}

// estimate is the estimate in ms, moved by halves half round trips of its
// sample (-1: less its error), and false until a sample was observed.
func (c *Clock) estimate(halves int) (int64, bool) {
	t, ok := c.when(halves)
	if !ok {
		return 0, false
	}
	return t.UnixMilli(), true
}

// when is estimate's, as a time.
func (c *Clock) when(halves int) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.valid:
		return time.Time{}, false
	case c.stopped:
		return c.last, true
	}
	elapsed := time.Since(c.at) + time.Duration(halves)*c.rtt/2
	return c.server.Add(elapsed), true
}

// Sample records the TIME reply (server) of a transaction sent at sent,
// which returned just now. Redis read its clock between the two, so a
// right estimate puts the reply between its estimates of them, give or
// take its own error and a millisecond of rounding: a reply outside means
// the server's clock jumped, or runs at another pace (a test's stopped
// clock), and the estimate is thrown away for this reply.
func (c *Clock) Sample(server time.Time, sent time.Time) {
	received := time.Now()
	c.mu.Lock()
	if c.valid && !c.stopped {
		slack := c.rtt/2 + time.Millisecond
		early := c.server.Add(sent.Sub(c.at) - slack)
		late := c.server.Add(received.Sub(c.at) + slack)
		c.valid = !server.Before(early) && !server.After(late)
	}
	c.mu.Unlock()
	c.Observe(server, sent, received)
}

// Pace is what is known of the server clock's pace.
type Pace uint8

const (
	PaceUnknown Pace = iota
	PaceRunning      // it was seen moving
	PaceStopped      // it was seen standing still: a test's
)

// Pace returns what was seen of the server clock's pace.
func (c *Clock) Pace() Pace {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.stopped:
		return PaceStopped
	case c.running:
		return PaceRunning
	}
	return PaceUnknown
}
