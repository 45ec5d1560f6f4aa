package clock

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A server clock that stands still while requests are sent later and later
// is a test's: the estimate is then its latest reply, whatever the host's
// clock does.
func TestStoppedClock(t *testing.T) {
	var c Clock
	server := time.UnixMilli(1_000_000)
	host := time.Now()
	c.Observe(server, host, host.Add(100*time.Microsecond))
	if got := c.Pace(); got != PaceUnknown {
		t.Fatalf("after one reply: pace %v, want unknown", got)
	}
	c.Observe(server, host.Add(2*time.Millisecond), host.Add(2100*time.Microsecond))
	if got := c.Pace(); got != PaceStopped {
		t.Fatalf("the same time read 2ms later: pace %v, want stopped", got)
	}
	if now, ok := c.Now(); !ok || now != server.UnixMilli() {
		t.Fatalf("Now = %d, %v; want the reply's %d", now, ok, server.UnixMilli())
	}
}

// A server clock that moves as the host's does runs, also when each
// request is sent the moment the last reply arrived (a hammered Bucket).
func TestRunningClock(t *testing.T) {
	var c Clock
	server, host := time.UnixMilli(5_000_000), time.Now()
	const rtt = 200 * time.Microsecond
	for i := range 20 {
		sent := host.Add(time.Duration(i) * rtt)
		c.Observe(server.Add(time.Duration(i)*rtt+rtt/2), sent, sent.Add(rtt))
	}
	if got := c.Pace(); got != PaceRunning {
		t.Fatalf("pace %v, want running", got)
	}
}

// A clock that jumps (a test's SetTime, a clock set by hand) is not taken
// for a running one.
func TestJumpingClockDoesNotRun(t *testing.T) {
	var c Clock
	server, host := time.UnixMilli(5_000_000), time.Now()
	for i := range 10 {
		sent := host.Add(time.Duration(i) * 5 * time.Millisecond)
		c.Observe(server.Add(time.Duration(i)*time.Minute), sent, sent.Add(time.Millisecond))
	}
	if got := c.Pace(); got == PaceRunning {
		t.Fatal("a clock that jumped a minute per 5ms was taken for running")
	}
}

// Earliest is never later than the server's time: the estimate less half
// the sample's round trip.
func TestEarliestIsNotLate(t *testing.T) {
	var c Clock
	sent := time.Now()
	const rtt = 40 * time.Millisecond
	server := time.UnixMilli(9_000_000)
	c.Observe(server, sent, sent.Add(rtt))
	now, _ := c.Now()
	earliest, ok := c.Earliest()
	if !ok || now-earliest < (rtt/2).Milliseconds()-1 {
		t.Fatalf("Earliest %d, Now %d: want Earliest about %v sooner", earliest, now, rtt/2)
	}
}

// Expected is the estimate plus half the sample's round trip once the
// clock was seen running, when a transaction sent now reaches the server;
// before that, and on a test's stopped clock, it is Earliest.
func TestExpected(t *testing.T) {
	var c Clock
	if _, ok := c.Expected(); ok {
		t.Fatal("Expected before any sample reported a time")
	}
	server, host := time.UnixMilli(5_000_000), time.Now()
	const rtt = 20 * time.Millisecond
	c.Observe(server, host, host.Add(rtt))
	if e, _ := c.Expected(); e != first(c.Earliest()) {
		t.Fatalf("Expected %d before the clock was seen running, want Earliest %d", e, first(c.Earliest()))
	}
	for i := 1; i < 4; i++ { // each sent 25ms after the last, read 25ms later
		sent := host.Add(time.Duration(i) * 25 * time.Millisecond)
		c.Observe(server.Add(time.Duration(i)*25*time.Millisecond), sent, sent.Add(rtt+time.Millisecond))
	}
	if got := c.Pace(); got != PaceRunning {
		t.Fatalf("pace %v, want running", got)
	}
	e, _ := c.Expected()
	if now := first(c.Now()); e-now < (rtt/2).Milliseconds()-1 || e-now > (rtt/2).Milliseconds()+1 {
		t.Fatalf("Expected %d, Now %d: want Expected about %v later", e, now, rtt/2)
	}
	var stopped Clock
	stopped.Observe(server, host, host.Add(100*time.Microsecond))
	stopped.Observe(server, host.Add(2*time.Millisecond), host.Add(2100*time.Microsecond))
	if e, _ := stopped.Expected(); e != server.UnixMilli() {
		t.Fatalf("on a stopped clock Expected = %d, want its reply's %d", e, server.UnixMilli())
	}
}

func first(ms int64, _ bool) int64 { return ms }

// Before any sample, Estimate asks the server (TIME) and keeps the reply.
func TestEstimateAsksFirst(t *testing.T) {
	mr := miniredis.RunT(t)
	at := time.UnixMilli(1_700_000_000_000)
	mr.SetTime(at)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	var set Set
	c := set.Of(mr.Addr())
	if set.Of(mr.Addr()) != c {
		t.Fatal("Of returned two clocks for one address")
	}
	if _, ok := c.Now(); ok {
		t.Fatal("Now before any sample reported a time")
	}
	got, err := c.Estimate(context.Background(), rdb)
	if err != nil || got < at.UnixMilli()-1000 || got > at.UnixMilli()+1000 {
		t.Fatalf("Estimate = %d, %v; want about %d", got, err, at.UnixMilli())
	}
	if _, ok := c.Now(); !ok {
		t.Fatal("Estimate kept no sample")
	}
}
