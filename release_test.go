package leakybucket

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// loseSetReply lets the pipelines that take the lock reach the server, then
// reports them failed, as a connection dropped after the write or a
// deadline hit while the reply was on its way would: the SET NX ran, and
// the caller does not know it. It does so for the first n of them.
type loseSetReply struct{ n atomic.Int64 }

func (h *loseSetReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseSetReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *loseSetReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if takesLock(cmds) && h.n.Add(-1) >= 0 {
			lost := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
			for _, cmd := range cmds {
				cmd.SetErr(lost)
			}
			return lost
		}
		return err
	}
}

func takesLock(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		args := cmd.Args()
		if cmd.Name() == "set" && len(args) > 3 && strings.EqualFold(args[3].(string), "nx") {
			return true
		}
	}
	return false
}

// A SET NX whose reply was lost took the lock all the same: the background
// release deletes it at once, so the next decision is not refused for the
// lock's TTL.
func TestLostSetReplyIsReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, s := range lockedStrategies {
			e := newMiniEnv(t, s)
			b := e.bucket(t, PerResource(PerMinute(10)), WithPrefix("lost-"+s.String()))
			lose := &loseSetReply{}
			lose.n.Store(1)
			e.rdb.AddHook(lose)
			if _, err := b.Allow(context.Background(), "r", "a"); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%v: Allow with the lock's reply lost: error %v, want ErrUnavailable", s, err)
			}
			lockKey := remoteOf(b).keysOf("r").ResourceLock()
			time.Sleep(time.Millisecond) // the release runs in the background
			synctest.Wait()
			if n := e.mini.Exists(lockKey); n {
				t.Fatalf("%v: the lock whose reply was lost is still held after 1ms", s)
			}
			other := e.bucket(t, PerResource(PerMinute(10)), WithPrefix("lost-"+s.String()), WithLockWait(0, 0))
			if res, err := other.Allow(context.Background(), "r", "b"); err != nil || !res.Allowed || res.Remaining != 9 {
				t.Errorf("%v: the next decision = %+v, %v; want admitted at once, nothing counted before", s, res, err)
			}
		}
	})
}

// slowServer delays every pipeline, as a server that stopped answering would.
type slowServer struct{ delay time.Duration }

func (h slowServer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowServer) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h slowServer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(h.delay)
		return next(ctx, cmds)
	}
}

// Every call returns by its own deadline, to the microsecond on fake time,
// however long Redis takes, with its own context's error; the work it left
// finishes in the background.
func TestCallsEndAtTheirDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		b := e.bucket(t, PerResource(PerMinute(10)))
		e.rdb.AddHook(slowServer{time.Second})
		const deadline = 200 * time.Millisecond
		for name, call := range map[string]func(context.Context) error{
			"Allow":    func(ctx context.Context) error { _, err := b.Allow(ctx, "r", "a"); return err },
			"Peek":     func(ctx context.Context) error { _, err := b.Peek(ctx, "r", "a"); return err },
			"Flush":    func(ctx context.Context) error { return b.Flush(ctx, "r", "a") },
			"FlushAll": func(ctx context.Context) error { return b.FlushAll(ctx, "r") },
		} {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			start := time.Now()
			err := call(ctx)
			cancel()
			if took := time.Since(start); took != deadline {
				t.Errorf("%s on a server answering after 1s returned after %v, want %v", name, took, deadline)
			}
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLockNotObtained) {
				t.Errorf("%s: error %v, want the context's deadline, not contention", name, err)
			}
			if !strings.HasPrefix(err.Error(), "leakybucket: ") {
				t.Errorf("%s: error %q does not say where it comes from", name, err)
			}
		}
		time.Sleep(10 * time.Second) // the bubble ends once the background work has
	})
}

// A caller whose batch was decided by another caller's work does not fail
// with that caller's deadline: a call with a short deadline and one
// without, queued behind a held lock, are decided apart.
func TestBatchDoesNotBorrowADeadline(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(PerMinute(10)))
		release := e.holdLock(t, b, "r", "")
		short, cancel := context.WithTimeout(context.Background(), 50*ms)
		defer cancel()
		first := allowAsync(short, b, "r", "a")
		second := allowAsync(context.Background(), b, "r", "b")
		if o := <-first; !errors.Is(o.err, ErrLockNotObtained) || !errors.Is(o.err, context.DeadlineExceeded) {
			t.Errorf("the short call: %+v (%v), want ErrLockNotObtained and its deadline", o, o.err)
		}
		release()
		if o := <-second; o.err != nil || !o.res.Allowed || o.res.Remaining != 9 {
			t.Errorf("the call without a deadline: %+v (%v), want admitted, the short one not counted", o, o.err)
		}
	})
}
