//go:build linux

package inflight

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const waiterVar = "INFLIGHT_WAITER" // set in a waiter child

// TestWaiterKilled: a waiter first in line whose process is killed with
// SIGKILL (it never leaves the line) holds up the waiter behind it for
// at most ticketTTL after its last sign of life, which came at most
// ticketRefresh before its death, plus the ticketRefresh after which the
// next one looks again: the bound docs/inflight.md gives.
func TestWaiterKilled(t *testing.T) {
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			pfx := uniquePrefix()
			l, err := New(clientOf(t, kind), PerResource(1), WithPrefix(pfx))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			holder, _, err := l.TryAcquire(ctx, "r", "holder")
			if err != nil || holder == nil {
				t.Fatalf("the holder: %v, %v", holder, err)
			}
			cmd := startWaiter(t, kind, pfx)
			waitForWaiters(t, l, "r", 1) // the child, first in line
			got := make(chan time.Time, 1)
			go func() {
				le, err := l.Acquire(ctx, "r", "behind")
				if err != nil {
					t.Error(err)
				}
				got <- time.Now()
				_ = le.Release(ctx)
			}()
			waitForWaiters(t, l, "r", 2)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			bound := ticketTTL + 2*ticketRefresh
			select {
			case at := <-got:
				t.Logf("the waiter behind was served %v after the kill (bound %v)", at.Sub(killed), bound)
			case <-time.After(bound + time.Second): // a second for a loaded host's scheduler
				t.Fatalf("the waiter behind a killed one not served %v after the kill (bound %v)", time.Since(killed), bound)
			}
		})
	}
}

// clientOf is a client of the real server of kind ("redis" or "cluster").
func clientOf(t *testing.T, kind string) redis.UniversalClient {
	if kind == "cluster" {
		return clusterClient(t)
	}
	return realClient(t)
}

// startWaiter starts TestWaiterChild on kind's server, on prefix pfx, and
// returns once it says it waits.
func startWaiter(t *testing.T, kind, pfx string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestWaiterChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), waiterVar+"="+kind, "INFLIGHT_PREFIX="+pfx)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "waiting\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	return cmd
}

// TestWaiterChild is the waiter of TestWaiterKilled: it waits in line,
// says so, and waits to be killed.
func TestWaiterChild(t *testing.T) {
	kind := os.Getenv(waiterVar)
	if kind == "" {
		t.Skip("a child of TestWaiterKilled")
	}
	l, err := New(clientOf(t, kind), PerResource(1), WithPrefix(os.Getenv("INFLIGHT_PREFIX")))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("waiting")
	_, _ = l.Acquire(context.Background(), "r", "child")
	t.Fatal("the child was served: its parent holds the limit until it is killed")
}
