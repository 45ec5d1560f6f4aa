package inflight

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A waiter whose wait runs out while it subscribes to its resource's
// channel (the subscription's reply comes late: a loaded server or
// machine) found no room in time: AcquireWithin returns no lease and no
// error, as when the wait runs out later in line. It is not
// ErrUnavailable: Redis was reached, only later than the wait allowed
// (httplimit answered such a request 503, beside a CPU hog).
func TestWaitRunningOutWhileSubscribingFindsNoRoom(t *testing.T) {
	for _, backend := range []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"miniredis", func(t *testing.T) string { return miniredis.RunT(t).Addr() }},
		{"redis", func(t *testing.T) string { return needAddr(t, redisAddrVar) }},
	} {
		t.Run(backend.name, func(t *testing.T) {
			slow := &slowNewConns{}
			rdb := redis.NewClient(&redis.Options{Addr: backend.addr(t), PoolSize: 4, Dialer: slow.dial})
			t.Cleanup(func() { _ = rdb.Close() })
			l := (&env{name: backend.name, rdb: rdb, pfx: uniquePrefix()}).limiter(t, PerResource(1))
			ctx := context.Background()
			held, err := l.Acquire(ctx, "r", "a")
			if err != nil || held == nil {
				t.Fatalf("the first lease: %v, %v", held, err)
			}
			defer func() { _ = held.Release(ctx) }()
			slow.delay.Store(int64(200 * time.Millisecond)) // the connections made from now on: the subscription's
			le, err := l.AcquireWithin(ctx, "r", "b", 1, 50*time.Millisecond)
			if err != nil || le != nil {
				t.Fatalf("a wait of 50ms that ran out while subscribing: lease %v, error %v; want none and no error: no room in time", le, err)
			}
			if slow.slowed.Load() == 0 {
				t.Fatal("no connection was slowed: the waiter did not subscribe")
			}
		})
	}
}

// slowNewConns dials connections on which the reply to a SUBSCRIBE
// comes delay late, as delay read when each is dialed.
type slowNewConns struct {
	delay  atomic.Int64
	slowed atomic.Int64
}

func (s *slowNewConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil || s.delay.Load() == 0 {
		return c, err
	}
	return &slowConn{Conn: c, delay: time.Duration(s.delay.Load()), slowed: &s.slowed}, nil
}

type slowConn struct {
	net.Conn
	delay   time.Duration
	slowed  *atomic.Int64
	pending atomic.Bool // a SUBSCRIBE was written, its reply not read
}

func (c *slowConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.pending.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *slowConn) Read(b []byte) (int, error) {
	if c.pending.CompareAndSwap(true, false) {
		c.slowed.Add(1)
		time.Sleep(c.delay)
	}
	return c.Conn.Read(b)
}
