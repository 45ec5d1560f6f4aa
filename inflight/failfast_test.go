//go:build linux

package inflight

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/stall"
)

// failFastBound is how long the first call to a Redis that is gone may
// take, as the Bucket's: the breaker's probe looks after SuspectAfter
// (10 ms) and a refused dial answers at once. The race detector slows
// every goroutine 5 to 20 times (a first call took 66 ms, less stalls,
// beside a CPU hog): under it the bound is failFastRaceBound, and make
// test runs these tests again without it, where the bound is 50 ms.
const (
	failFastBound     = 50 * time.Millisecond
	failFastRaceBound = 5 * failFastBound
)

// acquireCalls are the calls measured: one that does not wait, and one
// that would wait in line.
var acquireCalls = map[string]func(ctx context.Context, l *Limiter) error{
	"TryAcquire": func(ctx context.Context, l *Limiter) error { _, _, err := l.TryAcquire(ctx, "r", "c"); return err },
	"Acquire":    func(ctx context.Context, l *Limiter) error { _, err := l.Acquire(ctx, "r", "c"); return err },
}

// TestFailFastKilled: a Limiter on a client of go-redis's default options
// (5 dial attempts 100 ms apart, 3 retries) was in use, and its Redis is
// killed: the first call after the kill, and the next, fail within 50 ms
// with ErrUnavailable and the network cause, not after the client's
// retries (811 ms measured before).
func TestFailFastKilled(t *testing.T) {
	for name, call := range acquireCalls {
		t.Run(name, func(t *testing.T) {
			p := startRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: p.addr()})
			defer rdb.Close()
			l, err := New(rdb, PerResource(3))
			if err != nil {
				t.Fatal(err)
			}
			if err := call(context.Background(), l); err != nil { // in use: its clock and a connection are warm
				t.Fatal(err)
			}
			p.kill()
			checkFailsFast(t, l, call)
		})
	}
}

// TestFailFastNeverStarted: the same on an address where no server ever
// ran: the first call of the Limiter, and the next, fail within 50 ms
// with ErrUnavailable and ECONNREFUSED; before, each waited out its 1 s
// context, and the first said only context.DeadlineExceeded.
func TestFailFastNeverStarted(t *testing.T) {
	for name, call := range acquireCalls {
		t.Run(name, func(t *testing.T) {
			warmUp(t, call)
			checkFailsFast(t, neverStarted(t), call)
		})
	}
}

// warmUp runs call once on a Limiter of its own, on a live miniredis, so
// that what the process does once whatever the server (loading code,
// starting the runtime's timers) is not counted in the first call to the
// dead one: the first call there is still the first.
func warmUp(t *testing.T, call func(context.Context, *Limiter) error) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	l, err := New(rdb, PerResource(3))
	if err != nil {
		t.Fatal(err)
	}
	if err := call(context.Background(), l); err != nil {
		t.Fatal(err)
	}
}

// checkFailsFast makes two calls with 1 s contexts: each must fail within
// failFastBound, less the time the scheduler did not run this process
// (a loaded host), with ErrUnavailable and a network cause.
func checkFailsFast(t *testing.T, l *Limiter, call func(context.Context, *Limiter) error) {
	t.Helper()
	meter := stall.Start()
	defer meter.Close()
	bound := failFastBound
	if raceEnabled {
		bound = failFastRaceBound
	}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		err := call(ctx, l)
		end := time.Now()
		cancel()
		stalled := meter.During(start, end)
		took := end.Sub(start) - stalled
		t.Logf("call %d: %v after %v (%v stalled): %v", i+1, end.Sub(start), took, stalled, err)
		if !errors.Is(err, ErrUnavailable) || !networkCause(err) || took > bound {
			t.Errorf("call %d: %v after %v (less stalls), want ErrUnavailable with its network cause within %v", i+1, err, took, bound)
		}
	}
}

// networkCause reports whether err keeps the network's own error: a
// refused dial or a connection cut.
func networkCause(err error) bool {
	var opErr *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.As(err, &opErr)
}

// TestFailFastHeld: Held, which reads with a pipeline of its own, fails
// as fast on a server never started.
func TestFailFastHeld(t *testing.T) {
	held := func(ctx context.Context, l *Limiter) error { _, err := l.Held(ctx, "r"); return err }
	warmUp(t, held)
	checkFailsFast(t, neverStarted(t), held)
}

// neverStarted returns a Limiter on a client of go-redis's default
// options whose address no server listens on: a port that was free a
// moment ago.
func neverStarted(t *testing.T) *Limiter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, PerResource(3))
	if err != nil {
		t.Fatal(err)
	}
	return l
}
