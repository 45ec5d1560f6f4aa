package leakybucket

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// An outageSwitch stands for a Redis server that a test takes away and
// brings back, on miniredis, so that the fallback's logic runs on fake
// time (a synctest bubble) or under -race without a process to kill: the
// Dialer of the clients it makes, and of their breakers' probes. Down, it
// refuses every dial (ECONNREFUSED, a port nothing listens on) and fails
// the connections it made (ECONNRESET, a killed server's); hung, it
// refuses dials too, and holds the writes of its connections until it is
// up or down again, as a server whose host vanished. miniredis keeps its
// data throughout: what the Bucket counted there before is still there.
type outageSwitch struct {
	m *miniredis.Miniredis

	// bubble: the switch runs in a synctest bubble (see its cleanup).
	bubble bool

	mu      sync.Mutex
	state   switchState
	conns   map[*switchConn]struct{}
	changed chan struct{} // closed, and made again, on every change of state
}

type switchState uint8

const (
	switchUp switchState = iota
	switchDown
	switchHung
)

// newOutageSwitch starts a miniredis behind a switch that is up, in the
// current synctest bubble if bubble.
func newOutageSwitch(t *testing.T, bubble bool) *outageSwitch {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	if c, err := m.Dial(); err != nil { // the server exists from the first Dial on
		t.Fatal(err)
	} else {
		c.Close()
	}
	sw := &outageSwitch{m: m, bubble: bubble, conns: map[*switchConn]struct{}{}, changed: make(chan struct{})}
	t.Cleanup(func() {
		// Up, it releases held writes; the breaker's probe, go-redis's
		// dials and the lock's background release see the server, and
		// end. In a bubble, time stops once the test's goroutine exits:
		// they must end before, so the switch's cleanup waits for them,
		// on fake time.
		sw.set(switchUp)
		if sw.bubble {
			time.Sleep(5 * time.Second)
		}
		m.Close()
	})
	return sw
}

// client returns a client of the switch's server, with opts's
// Dialer, timeouts and maintenance notifications set as a synctest bubble
// needs them; closed when the test ends.
func (sw *outageSwitch) client(t *testing.T, opts redis.Options) *redis.Client {
	t.Helper()
	opts.Addr, opts.Dialer = "miniredis", sw.dial
	// Fake time runs while a write waits for miniredis to read it:
	// contexts bound the calls instead.
	opts.ReadTimeout, opts.WriteTimeout = -2, -2
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	rdb := redis.NewClient(&opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Down takes the server away: dials refused, connections reset.
func (sw *outageSwitch) Down() { sw.set(switchDown) }

// Hang takes the server away silently: dials refused, writes held.
func (sw *outageSwitch) Hang() { sw.set(switchHung) }

// Up brings the server back.
func (sw *outageSwitch) Up() { sw.set(switchUp) }

func (sw *outageSwitch) set(s switchState) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.state = s
	close(sw.changed)
	sw.changed = make(chan struct{})
	if s != switchDown {
		return
	}
	for c := range sw.conns {
		c.reset.Store(true)
		_ = c.Conn.Close() // wakes a read that waits for a reply
		delete(sw.conns, c)
	}
}

// dial is the clients' Dialer.
func (sw *outageSwitch) dial(context.Context, string, string) (net.Conn, error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	if sw.state != switchUp {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	c, err := sw.m.Dial()
	if err != nil {
		return nil, err
	}
	sc := &switchConn{Conn: newQueuedConn(c), sw: sw}
	sw.conns[sc] = struct{}{}
	return sc, nil
}

// pass waits while the switch is hung, and returns the error of a
// connection of a server that is down, or nil once it is up.
func (sw *outageSwitch) pass(op string) error {
	for {
		sw.mu.Lock()
		state, changed := sw.state, sw.changed
		sw.mu.Unlock()
		switch state {
		case switchUp:
			return nil
		case switchDown:
			return &net.OpError{Op: op, Net: "tcp", Err: syscall.ECONNRESET}
		}
		<-changed
	}
}

// switchConn is a connection the switch made.
type switchConn struct {
	net.Conn
	sw    *outageSwitch
	reset atomic.Bool // the switch went down: it fails as a killed server's would
}

func (c *switchConn) Write(b []byte) (int, error) {
	if err := c.sw.pass("write"); err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(b)
	return n, c.failure("write", err)
}

func (c *switchConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, c.failure("read", err)
}

// failure is what a killed server's connection says instead of err, the
// error of an operation on a pipe the switch closed.
func (c *switchConn) failure(op string, err error) error {
	if err != nil && c.reset.Load() {
		return &net.OpError{Op: op, Net: "tcp", Err: syscall.ECONNRESET}
	}
	return err
}
