package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/lock"
)

// pauseBeforeExec stalls the MULTI/EXEC of a decision, like a GC pause or a
// slow network would.
type pauseBeforeExec struct{ pause time.Duration }

func (p pauseBeforeExec) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p pauseBeforeExec) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (p pauseBeforeExec) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			time.Sleep(p.pause)
		}
		return next(ctx, cmds)
	}
}

// A holder whose lock expired before its EXEC writes nothing: the WATCH on
// the lock aborts the transaction.
func TestLockExpiredWritesNothing(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(5, time.Minute)), WithLockTTL(50*time.Millisecond))
		e.addHook(pauseBeforeExec{100 * time.Millisecond})
		_, err := b.Allow(context.Background(), "r", "a")
		if !errors.Is(err, ErrLockExpired) {
			t.Fatalf("Allow with the lock expired before EXEC: error %v, want ErrLockExpired", err)
		}
		if keys := e.keys(t); len(keys) != 0 {
			t.Errorf("a decision whose lock expired wrote %q", keys)
		}
	})
}

// busyLocks counts the lock attempts (SET NX) that found the lock taken,
// so that a test can act once a decision is waiting for a lock rather than
// after a sleep that a loaded machine may outlast.
type busyLocks struct {
	mu   sync.Mutex
	n    int
	more chan struct{} // closed, and replaced, at each count
}

func newBusyLocks() *busyLocks { return &busyLocks{more: make(chan struct{})} }

func (b *busyLocks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (b *busyLocks) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (b *busyLocks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if lockRefused(cmd) {
				b.mu.Lock()
				b.n++
				close(b.more)
				b.more = make(chan struct{})
				b.mu.Unlock()
			}
		}
		return err
	}
}

// lockRefused reports whether cmd is a SET NX of a lock (not of a claim to
// be next in line) that set nothing: the lock was taken.
func lockRefused(cmd redis.Cmder) bool {
	args := cmd.Args()
	if cmd.Name() != "set" || len(args) < 2 || strings.HasSuffix(fmt.Sprint(args[1]), ":next") {
		return false
	}
	if set, ok := cmd.(*redis.BoolCmd); ok {
		return set.Err() == nil && !set.Val()
	}
	return errors.Is(cmd.Err(), redis.Nil)
}

// wait returns true once n attempts found the lock taken, or false when
// stop is closed or a minute has passed.
func (b *busyLocks) wait(n int, stop <-chan struct{}) bool {
	timeout := time.After(time.Minute)
	for {
		b.mu.Lock()
		got, more := b.n, b.more
		b.mu.Unlock()
		if got >= n {
			return true
		}
		select {
		case <-more:
		case <-stop:
			return false
		case <-timeout:
			return false
		}
	}
}

// While another holder keeps the lock, a decision waits until its context
// ends, or gives up at once with NoRetry, and writes nothing.
//
// Once a decision has sent a SET, its round trips run on a context of the
// lock's own, so a deadline that falls in one does not cut it short and
// the caller still learns of the contention.
func TestLockBusy(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(5, time.Minute)))
		lockKey := remoteOf(b).keysOf("r").ClientLock("a")
		e.admin.Set(context.Background(), lockKey, "someone else", time.Minute)
		// The Bucket's connections and clock estimate first, so that the
		// deadline is spent on the lock, not on dialing a loaded server.
		if _, err := b.Peek(context.Background(), "r", "a"); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if e.real {
			// A loaded machine may take most of 100 ms to send the first
			// SET: the caller must see the lock busy before its end.
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		}
		defer cancel()
		_, err := b.Allow(ctx, "r", "a")
		if !errors.Is(err, ErrLockNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Allow on a held lock until the deadline: error %v, want ErrLockNotObtained and DeadlineExceeded", err)
		}

		once := e.bucket(t, PerClient(Per(5, time.Minute)), WithLockWait(0, 0))
		waitIdle(t, b) // its batch's last poll ends after the caller left
		var trips int64
		trips = e.trips.count(func() { _, err = once.Allow(context.Background(), "r", "a") })
		if !errors.Is(err, ErrLockNotObtained) {
			t.Errorf("Allow on a held lock with NoRetry: error %v, want ErrLockNotObtained", err)
		}
		if trips != 2 { // the attempt, then UNWATCH of the attempt's WATCH
			t.Errorf("Allow on a held lock with NoRetry: %d round trips, want 2", trips)
		}
		if got := e.admin.Get(context.Background(), lockKey).Val(); got != "someone else" {
			t.Errorf("the other holder's lock is now %q", got)
		}
		// The waiter's claim to be next in line lapses on its own.
		time.Sleep(lock.ClaimTTL + ms)
		if keys := e.keys(t); len(keys) != 1 {
			t.Errorf("keys %q, want only the other holder's lock", keys)
		}
		// Other clients have locks of their own, as every rule is per-client.
		if res, err := b.Allow(context.Background(), "r", "b"); err != nil || !res.Allowed {
			t.Errorf("Allow(r, b) while a's lock is held = %+v, %v", res, err)
		}
	})
}

// A decision that found the lock busy takes it once it is released, and its
// write is not aborted by the release it watched while waiting. The lock is
// released once the decision has found it taken, whatever the scheduler does.
func TestLockReleasedWhileWaiting(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(Per(5, time.Minute)))
		busy := newBusyLocks()
		e.addHook(busy)
		lockKey := remoteOf(b).keysOf("r").ResourceLock()
		e.admin.Set(ctx, lockKey, "someone else", time.Minute)
		done := make(chan bool)
		go func() {
			waited := busy.wait(1, nil)
			e.admin.Del(ctx, lockKey)
			done <- waited
		}()
		res, err := b.Allow(ctx, "r", "a")
		if !<-done {
			t.Error("Allow never found the lock taken")
		}
		if err != nil || !res.Allowed || res.Remaining != 4 {
			t.Fatalf("Allow after the lock was released = %+v, %v; want admitted with 4 left", res, err)
		}
		// The connection went back to the pool clean: no WATCH left armed.
		for range 3 {
			if _, err := b.Allow(ctx, "r", "a"); err != nil {
				t.Fatalf("Allow on reused connections: %v", err)
			}
		}
		if res, _ := b.Peek(ctx, "r", "a"); res.Remaining != 0 || !res.Allowed {
			t.Errorf("Peek after 4 admitted of 5 = %+v, want 1 left (Remaining 0 after it)", res)
		}
	})
}

// A Redis error is returned wrapped, with the package prefix, and the
// decision records nothing.
func TestRedisErrorIsWrapped(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	b, err := New(rdb, PerClient(Per(1, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	m.SetError("LOADING Redis is loading the dataset in memory")
	for name, call := range map[string]func() error{
		"Allow":    func() error { _, err := b.Allow(context.Background(), "r", "a"); return err },
		"Peek":     func() error { _, err := b.Peek(context.Background(), "r", "a"); return err },
		"Flush":    func() error { return b.Flush(context.Background(), "r", "a") },
		"FlushAll": func() error { return b.FlushAll(context.Background(), "r") },
	} {
		err := call()
		var rerr redis.Error
		if !errors.As(err, &rerr) || !strings.HasPrefix(err.Error(), "leakybucket: LOADING") {
			t.Errorf("%s on a failing server: error %v, want a wrapped redis.Error", name, err)
		}
	}
	m.SetError("")
	if keys := m.Keys(); len(keys) != 0 {
		t.Errorf("failed calls wrote %q", keys)
	}
}

// A server that cannot be reached is ErrUnavailable, with the refused
// connection in the chain, for every call.
func TestUnreachableServer(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: refusingAddr(t), MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	b, err := New(rdb, PerResource(Per(1, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func(context.Context) error{
		"Allow":    func(ctx context.Context) error { _, err := b.Allow(ctx, "r", ""); return err },
		"Peek":     func(ctx context.Context) error { _, err := b.Peek(ctx, "r", ""); return err },
		"Flush":    func(ctx context.Context) error { return b.Flush(ctx, "r", "") },
		"FlushAll": func(ctx context.Context) error { return b.FlushAll(ctx, "r") },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := call(ctx)
		cancel()
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) ||
			!strings.HasPrefix(err.Error(), "leakybucket: ") || !strings.Contains(err.Error(), "connection refused") {
			t.Errorf("%s on a closed port: error %v, want ErrUnavailable, with ECONNREFUSED and its text in the chain", name, err)
		}
	}
}

// refusingAddr returns a loopback address that refuses connections for the
// rest of the test: its port is bound by a socket that never listens, so no
// other process can take it meanwhile, as it could a port merely closed.
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// takeOverAndAbort plays a decision whose lock passed to another holder
// before its EXEC, and whose transaction Redis then discards (EXECABORT, as
// when a queued write is refused for memory or by ACL).
type takeOverAndAbort struct {
	rdb     redis.UniversalClient
	lockKey string
}

func (h takeOverAndAbort) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h takeOverAndAbort) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h takeOverAndAbort) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		// The release: MULTI, the first write (of any strategy), ..., DEL lock.
		if len(cmds) > 3 && cmds[0].Name() == "multi" && cmds[1].Name() != "del" {
			h.rdb.Set(ctx, h.lockKey, "the next holder", time.Minute)
			cmds[1].Args()[0] = "no-such-command"
		}
		return next(ctx, cmds)
	}
}

// After an aborted EXEC, the cleanup frees the lock only if it is still
// ours: it must not delete the next holder's lock, nor leave a WATCH on the
// connection.
func TestExecAbortKeepsTheNextHoldersLock(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(PerMinute(5)))
		lockKey := remoteOf(b).keysOf("r").ResourceLock()
		e.addHook(takeOverAndAbort{e.admin, lockKey})
		// Redis refuses the command and discards the EXEC (EXECABORT): the
		// error is the refused command's own, as for a transaction of
		// SortedSet or Windows (a MOVED among them then reaches the
		// cluster route); miniredis checks the WATCH first.
		var refused redis.Error
		if _, err := b.Allow(ctx, "r", "a"); !(errors.As(err, &refused) && strings.Contains(err.Error(), "no-such-command")) && !errors.Is(err, ErrLockExpired) {
			t.Fatalf("Allow with a discarded EXEC: error %v, want the refused command's error, wrapped, or ErrLockExpired", err)
		}
		if got := e.admin.Get(ctx, lockKey).Val(); got != "the next holder" {
			t.Fatalf("the next holder's lock is now %q", got)
		}
		e.admin.Del(ctx, lockKey)
		res, err := b.Peek(ctx, "r", "a")
		if err != nil || res.Remaining != 4 {
			t.Errorf("Peek after the discarded EXEC = %+v, %v; want nothing recorded", res, err)
		}
	})
}

// waitIdle waits until no batch of b is under way: the work a caller left
// when its context ended goes on in the background for up to a round trip.
func waitIdle(t *testing.T, b *Bucket) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		busy := remoteOf(b).batches.Lines()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lines of b still busy after 5s", busy)
		}
	}
}
