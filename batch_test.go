package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// holdLock takes the lock of (resource, client) in b as another process
// would, and returns a function that frees it.
func (e *env) holdLock(t *testing.T, b *Bucket, resource, client string) func() {
	t.Helper()
	key := lockKey(b, resource, client)
	if err := e.admin.Set(context.Background(), key, "another process", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	return func() { e.admin.Del(context.Background(), key) }
}

// lockKey is the key of b's lock of (resource, client), under Logs.
func lockKey(b *Bucket, resource, client string) string {
	return remoteOf(b).strategy.Line(remoteOf(b).keysOf(resource), client)
}

// busyAttempts counts the attempts to take the lock named key that found
// it held: pipelines whose SET key ... NX replied nil.
type busyAttempts struct {
	pipelinesOnly
	key string
	n   atomic.Int64
}

func (h *busyAttempts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if args := c.Args(); commandName(c) == "set" && len(args) > 1 && fmt.Sprint(args[1]) == h.key && errors.Is(c.Err(), redis.Nil) {
				h.n.Add(1)
			}
		}
		return err
	}
}

// waiting returns how many calls of b wait behind the batch deciding for
// the lock of (resource, client), or -1 if none is deciding: a batch takes
// the calls queued so far when it starts, so while it waits for a lock
// held elsewhere, the calls after it queue in arrival order.
func (e *env) waiting(b *Bucket, resource, client string) int {
	return remoteOf(b).batches.Waiting(remoteOf(b).batchKey(resource, client))
}

// awaitWaiting returns once n calls wait behind the leader for the lock of
// (resource, client) (n = 0: a leader decides and none waits), so that
// calls are made in a known order however late the scheduler runs them.
func (e *env) awaitWaiting(t *testing.T, b *Bucket, resource, client string, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); e.waiting(b, resource, client) != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls wait for the lock after a minute, want %d", e.waiting(b, resource, client), n)
		}
	}
}

// awaitContended returns once b's line for the lock of (resource, client)
// has seen the lock held by another holder: a hook sees the busy reply
// before the Bucket does, so a test that ends a call right after the hook
// saw it could end it before the Bucket knew of the contention, however
// late a loaded scheduler runs it.
func (e *env) awaitContended(t *testing.T, b *Bucket, resource, client string) {
	t.Helper()
	key := remoteOf(b).batchKey(resource, client)
	contended := func() bool { return remoteOf(b).batches.Contended(key) }
	for deadline := time.Now().Add(time.Minute); !contended(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Bucket never saw the lock busy, after a minute")
		}
	}
}

// allowAsync starts Allow in a goroutine and returns where its outcome
// arrives.
func allowAsync(ctx context.Context, b *Bucket, resource, client string) chan outcome {
	out := make(chan outcome, 1)
	go func() {
		res, err := b.Allow(ctx, resource, client)
		out <- outcome{res, err}
	}()
	return out
}

type outcome struct {
	res Result
	err error
}

// Calls queued behind one leader are decided together, in arrival order,
// each with its own Result: with the lock held elsewhere, 20 calls queue;
// once it is free, the leader decides its own call and the next leader the
// other 19 under one lock, in a handful of round trips instead of 40. The
// attempts that found the lock still held are not among them: they are the
// wait for the other holder, as many as fit in the time its release takes
// (a DEL from another client, tens of milliseconds on a loaded machine,
// when an attempt is made every 2 ms).
func TestCoalescedCallsShareOneLock(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(Per(12, time.Minute)), PerClient(Per(5, time.Minute)))
		busy := &busyAttempts{key: lockKey(b, "r", "")}
		e.addHook(busy)
		release := e.holdLock(t, b, "r", "")
		var outs []chan outcome
		for i := range 20 {
			outs = append(outs, allowAsync(ctx, b, "r", []string{"a", "b", "c", "d"}[i%4]))
			e.awaitWaiting(t, b, "r", "", i) // in this order
		}
		waited := busy.n.Load()
		trips := e.trips.count(func() {
			release()
			for i, out := range outs {
				if o := <-out; o.err != nil || o.res.Allowed != (i < 12) {
					t.Errorf("call %d: %+v, want allowed=%v: the first 12 to arrive fit", i, o, i < 12)
				}
			}
		})
		waited = busy.n.Load() - waited
		if trips-waited > 8 {
			t.Errorf("20 queued calls took %d round trips once the lock was free (%d more found it held), want at most 8", trips-waited, waited)
		}
		res, err := b.Peek(ctx, "r", "a")
		if err != nil || res.Rules[0].Used != 12 || res.Rules[1].Used != 3 {
			t.Errorf("after 20 calls: Peek = %+v, %v; want 12 in all, a admitted 3 (calls 0, 4, 8)", res.Rules, err)
		}
	})
}

// A call whose context ends while it waits behind the leader leaves the
// queue, returns ErrLockNotObtained, and is recorded nowhere; the leader
// goes on.
func TestCoalescedCallLeavesOnItsDeadline(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(5, time.Minute)))
		release := e.holdLock(t, b, "r", "a")
		leader := allowAsync(context.Background(), b, "r", "a")
		e.awaitWaiting(t, b, "r", "a", 0)
		ctx, cancel := context.WithTimeout(context.Background(), 100*ms)
		defer cancel()
		follower := allowAsync(ctx, b, "r", "a")
		if o := <-follower; !errors.Is(o.err, ErrLockNotObtained) || !errors.Is(o.err, context.DeadlineExceeded) {
			t.Errorf("follower past its deadline: %+v, want ErrLockNotObtained and DeadlineExceeded", o)
		}
		release()
		if o := <-leader; o.err != nil || !o.res.Allowed || o.res.Remaining != 4 {
			t.Errorf("leader: %+v, want admitted with 4 left", o)
		}
		// Remaining counts the peeked call too.
		if res, err := b.Peek(context.Background(), "r", "a"); err != nil || res.Remaining != 3 {
			t.Errorf("Peek = %+v, %v; want only the leader recorded", res, err)
		}
	})
}

// When the leader's context ends first, its followers are not failed with
// it: the next one leads, and they are decided once the lock is free.
//
// On fake time the leader's context is a 100ms timeout, which ends once
// the followers queue. On a real clock the followers might queue after
// that, so the leader's context is cancelled once they have queued and the
// leader's batch has found the lock taken (ErrLockNotObtained means it was
// seen held by another).
func TestCoalescedLeaderLeavesFollowersDecided(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(5, time.Minute)))
		busy := newBusyLocks()
		e.addHook(busy)
		release := e.holdLock(t, b, "r", "a")
		ctx, cancel := context.WithTimeout(context.Background(), 100*ms)
		if e.real {
			ctx, cancel = context.WithCancel(context.Background())
		}
		defer cancel()
		leader := allowAsync(ctx, b, "r", "a")
		e.awaitWaiting(t, b, "r", "a", 0)
		var followers []chan outcome
		for i := range 3 {
			followers = append(followers, allowAsync(context.Background(), b, "r", "a"))
			e.awaitWaiting(t, b, "r", "a", i+1)
		}
		if e.real {
			busy.wait(1, nil)
			e.awaitContended(t, b, "r", "a")
			cancel()
		}
		if o := <-leader; !errors.Is(o.err, ErrLockNotObtained) {
			t.Errorf("leader past its deadline: %+v (%v), want ErrLockNotObtained", o, o.err)
		}
		time.Sleep(100 * ms)
		release()
		var wg sync.WaitGroup
		for i, f := range followers {
			wg.Go(func() {
				if o := <-f; o.err != nil || !o.res.Allowed {
					t.Errorf("follower %d: %+v, want admitted", i, o)
				}
			})
		}
		wg.Wait()
		if res, err := b.Peek(context.Background(), "r", "a"); err != nil || res.Remaining != 1 {
			t.Errorf("Peek = %+v, %v; want the 3 followers recorded", res, err)
		}
	})
}
