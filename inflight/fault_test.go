//go:build linux

package inflight

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/stall"
)

// Fault tests drive real processes: a holder process killed with
// SIGKILL, and a redis-server of the test's own, paused, killed and
// restarted.

const holderVar = "INFLIGHT_HOLDER" // set in a holder child: its mode

// TestHolderKilled: a holder process killed with SIGKILL stops counting
// within its lease's TTL; one that keeps its lease alive (an Extend every
// TTL/3) keeps its room for 10 TTLs, and loses it within a TTL of its
// death.
func TestHolderKilled(t *testing.T) {
	needAddr(t, redisAddrVar)
	const ttl = 600 * time.Millisecond
	for _, mode := range []string{"hold", "keepalive"} {
		t.Run(mode, func(t *testing.T) {
			pfx := uniquePrefix()
			l, err := New(realClient(t), PerResource(2), WithPrefix(pfx), WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestHolderChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), holderVar+"="+mode, "INFLIGHT_PREFIX="+pfx)
			cmd.Stderr = os.Stderr
			out, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil || line != "held\n" {
				t.Fatalf("child said %q, %v", line, err)
			}
			acquired := time.Now()
			ctx := context.Background()
			if mode == "keepalive" {
				for time.Since(acquired) < 10*ttl {
					if _, ok, err := l.TryAcquire(ctx, "r", "parent"); ok || err != nil {
						t.Fatalf("room taken from a lease kept alive after %v: %v", time.Since(acquired), err)
					}
					time.Sleep(ttl / 10)
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			var le *Lease
			for le == nil {
				asked := time.Now()
				var err error
				if le, _, err = l.TryAcquire(ctx, "r", "parent"); err != nil {
					t.Fatal(err)
				}
				// Late only if the room is still taken when asked: a test
				// process that itself did not run for a while finds it
				// free, late, or is answered late.
				if le == nil && asked.Sub(killed) > ttl+100*time.Millisecond {
					t.Fatalf("the dead holder still counts %v after its death (ttl %v)", asked.Sub(killed), ttl)
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("room back %v after the kill (ttl %v)", time.Since(killed), ttl)
			_ = le.Release(ctx)
		})
	}
}

// TestHolderChild is the holder of TestHolderKilled: it takes the whole
// limit, says so, and waits to be killed.
func TestHolderChild(t *testing.T) {
	mode := os.Getenv(holderVar)
	if mode == "" {
		t.Skip("a child of TestHolderKilled")
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(redisAddrVar)})
	l, err := New(rdb, PerResource(2), WithPrefix(os.Getenv("INFLIGHT_PREFIX")), WithTTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	le, ok, err := l.TryAcquireN(context.Background(), "r", "child", 2)
	if !ok || err != nil {
		t.Fatalf("%v %v", ok, err)
	}
	if mode == "keepalive" {
		lost := le.KeepAlive(context.Background())
		go func() {
			if err := <-lost; err != nil {
				fmt.Fprintln(os.Stderr, "keepalive:", err)
				os.Exit(3)
			}
		}()
	}
	fmt.Println("held")
	time.Sleep(time.Minute)
}

// redisProc is a redis-server of the test's own, scripting denied.
type redisProc struct {
	t    *testing.T
	dir  string
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
}

func startRedis(t *testing.T) *redisProc {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProc{t: t, dir: t.TempDir(), port: ln.Addr().(*net.TCPAddr).Port}
	ln.Close()
	p.spawn()
	t.Cleanup(p.kill)
	return p
}

func (p *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

func (p *redisProc) spawn() {
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir, "--logfile", filepath.Join(p.dir, "log"),
		"--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			p.t.Fatal("redis-server did not start")
		}
	}
}

func (p *redisProc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
}

func (p *redisProc) kill() {
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGKILL)
	p.mu.Lock()
	_ = p.cmd.Wait()
	p.mu.Unlock()
}

// TestRedisFaults: while Redis is paused, calls end by their deadline;
// killed, the breaker answers at once; restarted, the limit holds again,
// and a lease it forgot says so at its next Extend.
func TestRedisFaults(t *testing.T) {
	p := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()
	l, err := New(rdb, PerResource(3), WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	held, _, err := l.TryAcquire(ctx, "r", "before")
	if err != nil {
		t.Fatal(err)
	}
	deadline := 200 * time.Millisecond
	// A call's time, less the time this process could not run meanwhile
	// (a loaded host's scheduler: 60 ms and more at a load of 10), which no
	// deadline of the library's can shorten.
	meter := stall.Start()
	defer meter.Close()
	timed := func(f func(ctx context.Context) error) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		err := f(ctx)
		end := time.Now()
		return end.Sub(start) - meter.During(start, end), err
	}
	acquire := func(ctx context.Context) error { _, err := l.Acquire(ctx, "r", "c"); return err }
	// Paused: every call ends by its deadline.
	p.signal(syscall.SIGSTOP)
	for _, f := range []func(context.Context) error{acquire, held.Release, func(ctx context.Context) error { return held.Extend(ctx, time.Second) }} {
		if d, err := timed(f); err == nil || d > deadline+50*time.Millisecond {
			t.Errorf("paused: a call took %v, err %v", d, err)
		}
	}
	p.signal(syscall.SIGCONT)
	// Killed: the first call finds it gone, the breaker answers the next
	// at once.
	p.kill()
	_, _ = timed(acquire)
	d, err := timed(acquire)
	if !errors.Is(err, ErrUnavailable) || d > 20*time.Millisecond {
		t.Errorf("killed: %v after %v, want ErrUnavailable at once", err, d)
	}
	// Restarted (without persistence: it forgot every lease).
	p.spawn()
	var le *Lease
	for start := time.Now(); le == nil; time.Sleep(10 * time.Millisecond) {
		le, _, err = l.TryAcquire(ctx, "r", "after")
		if time.Since(start) > 5*time.Second {
			t.Fatalf("Redis back, still %v", err)
		}
	}
	if err := held.Extend(ctx, time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Extend of a lease Redis forgot = %v, want ErrNotHeld", err)
	}
	// The limit holds on the new server: 3, then refused.
	n := 1
	for ; n < 10; n++ {
		if _, ok, err := l.TryAcquire(ctx, "r", "after"); err != nil || !ok {
			break
		}
	}
	if n != 3 {
		t.Errorf("after the restart %d held, limit 3", n)
	}
}

// TestWaiterToldServerGone: a waiter asleep in line learns that Redis is
// gone when the breaker opens, not at its next sign of life (500 ms).
func TestWaiterToldServerGone(t *testing.T) {
	p := startRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()
	l, err := New(rdb, PerResource(1), WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, _, err := l.TryAcquire(ctx, "r", "holder"); err != nil {
		t.Fatal(err)
	}
	gave := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, "r", "waiter")
		gave <- err
	}()
	waitForWaiters(t, l, "r", 1) // it looked: its next sign of life is 500 ms away
	p.kill()
	opened := time.Now()
	if _, _, err := l.TryAcquire(ctx, "r", "other"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryAcquire on a killed server: %v, want ErrUnavailable", err)
	}
	select {
	case err := <-gave:
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("the waiter: %v, want ErrUnavailable", err)
		}
		t.Logf("the waiter was told %v after the breaker opened", time.Since(opened))
	case <-time.After(300 * time.Millisecond):
		t.Errorf("the waiter still waits 300 ms after the breaker opened")
	}
}
