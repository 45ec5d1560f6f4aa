package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The adversary of the fallback: every method at once from many
// goroutines, while Redis goes away and comes back again and again (an
// outageSwitch on miniredis, on the real clock: the switches need the
// breaker's probe to run while the callers do). Run with -race, it fails
// on any data race of the switch both ways. The windows are an hour, so
// nothing leaves them: on the resources nobody flushes, Redis admits at
// most each rule's Requests, the process at most each share, what the
// process counts is exactly what its fallback admitted, and what Redis
// counts is at least what Redis admitted. It may count more: a call cut
// while its write was under way may be counted there and decided in
// process, and the switch refuses connections while keeping its data (a
// proxy that refuses while the server runs what it read), so the
// take-back of a transaction whose reply was lost never comes (see
// txn.Resolve): counted, never admitted.
func TestFallbackRaceFree(t *testing.T) {
	if testing.Short() {
		t.Skip("switches Redis away a few times on the real clock")
	}
	for name, s := range map[string]Strategy{"logs": Logs, "sorted set": SortedSet, "windows": Windows(time.Minute)} {
		t.Run(name, func(t *testing.T) {
			a := newFallbackAdversary(t, s)
			a.run(t)
			a.check(t)
		})
	}
}

// fbInstances: the rules of the adversary (advResourceLimit a resource,
// 6 and advClientLimit a client) are shared by this many processes.
const (
	fbInstances = 2
	fbSwitches  = 6 // times Redis goes away and comes back
)

// fallbackAdversary is a Bucket WithFallback under attack, and what the
// observer heard it admit on the resources nobody flushes, by resource,
// client and whether the fallback decided.
type fallbackAdversary struct {
	sw       *outageSwitch
	b        *Bucket
	admitted [2][advClients][2]atomic.Int64 // [resource][client][fallback]
	decided  [2]atomic.Int64                // calls decided, [fallback]
}

func newFallbackAdversary(t *testing.T, s Strategy) *fallbackAdversary {
	t.Helper()
	a := &fallbackAdversary{sw: newOutageSwitch(t, false)}
	// One dial attempt, no command retries: the switch's refusals come
	// back at once, as the README advises for an outage.
	rdb := a.sw.client(t, redis.Options{DialerRetries: 1, MaxRetries: -1})
	b, err := New(rdb, WithStrategy(s), WithFallback(fbInstances), WithObserver(a.observe),
		PerResource(Per(advResourceLimit, time.Hour)),
		PerClient(Per(6, time.Hour).WithPrecision(exactFor(s))),
		PerClient(Per(advClientLimit, 30*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	a.b = b
	return a
}

// observe counts what the observer hears: every admission, WaitN's
// included, with whether the fallback decided it.
func (a *fallbackAdversary) observe(_ context.Context, d Decision) {
	if d.Op != opAllow || d.Err != nil {
		return
	}
	fb := 0
	if d.Fallback {
		fb = 1
	}
	a.decided[fb].Add(1)
	r := slicesIndex(advResources[:2], d.Resource)
	if !d.Allowed || r < 0 {
		return
	}
	c, _ := strconv.Atoi(d.Client[1:])
	a.admitted[r][c][fb].Add(int64(d.N))
}

func slicesIndex(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// run makes random calls from advGoroutines goroutines while Redis goes
// away and comes back fbSwitches times, each switch once the calls have
// seen the last one (a decision on the other side).
func (a *fallbackAdversary) run(t *testing.T) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range advGoroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 29))
			var res Result
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := a.call(rng, &res); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range fbSwitches {
		a.sw.Down()
		a.await(t, 1)
		a.sw.Up()
		a.await(t, 0)
	}
	close(done)
	wg.Wait()
	t.Logf("decided on Redis %d, in process %d, across %d switches each way",
		a.decided[0].Load(), a.decided[1].Load(), fbSwitches)
}

// await waits until the calls have been decided by the other side for a
// while (fallback 1: in process; 0: on Redis).
func (a *fallbackAdversary) await(t *testing.T, fallback int) {
	t.Helper()
	from := a.decided[fallback].Load()
	for deadline := time.Now().Add(10 * time.Second); a.decided[fallback].Load() < from+50; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no decision with Fallback %v within 10s of the switch", fallback == 1)
		}
	}
}

// call makes one random call, as the local adversary does. AllowN,
// AllowNInto, PeekN and Usage must never fail: Redis is either there or
// the fallback decides. WaitN may run out of its time (50 ms: a weight
// above a share waits for Redis); Flush and FlushAll, on the resource
// they alone touch, say when Redis could not be reached.
func (a *fallbackAdversary) call(rng *rand.Rand, res *Result) error {
	ctx := context.Background()
	r, c, n := rng.IntN(len(advResources)), rng.IntN(advClients), 1+rng.IntN(3)
	resource, client := advResources[r], "c"+strconv.Itoa(c)
	var err error
	k := rng.IntN(20)
	switch {
	case k < 6:
		_, err = a.b.AllowN(ctx, resource, client, n)
	case k < 10:
		err = a.b.AllowNInto(ctx, resource, client, n, res)
	case k < 13:
		_, err = a.b.PeekN(ctx, resource, client, n)
	case k < 15:
		_, err = a.b.Usage(ctx, resource, client)
	case k < 17:
		ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err = a.b.WaitN(ctx, resource, client, n)
		if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			err = nil // its time ran out, maybe while Redis was unreachable
		}
	case k < 19:
		r, resource = len(advResources)-1, advResources[len(advResources)-1]
		if err = a.b.Flush(ctx, resource, client); errors.Is(err, ErrUnavailable) {
			err = nil
		}
	default:
		r, resource = len(advResources)-1, advResources[len(advResources)-1]
		if err = a.b.FlushAll(ctx, resource); errors.Is(err, ErrUnavailable) {
			err = nil
		}
	}
	if err == nil {
		return nil
	}
	return fmt.Errorf("call %d of %s by %s (n %d): %w", k, resource, client, n, err)
}

// check compares what was admitted on each side with the rules, their
// shares and what each side counts, once Redis is back for good.
func (a *fallbackAdversary) check(t *testing.T) {
	if a.decided[0].Load() == 0 || a.decided[1].Load() == 0 {
		t.Fatalf("decisions on Redis %d, in process %d: want both", a.decided[0].Load(), a.decided[1].Load())
	}
	ctx := context.Background()
	local := a.b.counts.(*fallback).local
	for r, resource := range advResources[:2] {
		var total [2]int64
		for c := range advClients {
			client := "c" + strconv.Itoa(c)
			redisAdmitted, localAdmitted := a.admitted[r][c][0].Load(), a.admitted[r][c][1].Load()
			total[0] += redisAdmitted
			total[1] += localAdmitted
			if redisAdmitted > advClientLimit || localAdmitted > advClientLimit/fbInstances {
				t.Errorf("%s %s: admitted %d on Redis (limit %d) and %d in process (share %d)",
					resource, client, redisAdmitted, advClientLimit, localAdmitted, advClientLimit/fbInstances)
			}
			inProcess := processUsage(t, local, resource, client)
			if used := inProcess[2].Used; int64(used) != localAdmitted {
				t.Errorf("%s %s: the process counts %d, its fallback admitted %d", resource, client, used, localAdmitted)
			}
			onRedis, err := a.b.Usage(ctx, resource, client)
			if err != nil {
				t.Fatal(err)
			}
			if used := onRedis[2].Used; int64(used) < redisAdmitted {
				t.Errorf("%s %s: Redis counts %d, admitted %d there", resource, client, used, redisAdmitted)
			}
		}
		if total[0] > advResourceLimit || total[1] > advResourceLimit/fbInstances {
			t.Errorf("%s: admitted %d on Redis (limit %d) and %d in process (share %d)", resource, total[0], advResourceLimit, total[1], advResourceLimit/fbInstances)
		}
		t.Logf("%s: admitted %d on Redis, %d in process", resource, total[0], total[1])
	}
}

// processUsage is Usage of the fallback's counts alone.
func processUsage(t *testing.T, l *localCounts, resource, client string) []RuleResult {
	t.Helper()
	rd, err := l.read(context.Background(), resource, client, 1)
	if err != nil {
		t.Fatal(err)
	}
	return rd.plan.evaluate(rd.View, 0, false).Rules
}
