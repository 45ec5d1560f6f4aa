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
	"testing/synctest"
	"time"
)

// The adversary of a local Bucket: every method at once from many
// goroutines, on a few resources and clients, with every strategy, with
// and without WithRecordDenied. Run with -race, it fails on any read of a
// scope outside its shard's lock. The windows are long and the clock is a
// synctest bubble's, stopped while the goroutines run, so nothing leaves a
// window: on the resources nobody flushes, no rule may admit more than
// its limit, and what each rule counts at the end is what was admitted.
func TestLocalRaceFree(t *testing.T) {
	configs := map[string]Strategy{"logs": Logs, "sorted set": SortedSet, "windows": Windows(time.Minute), "fixed windows": FixedWindows}
	for name, s := range configs {
		for _, recordDenied := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recordDenied=%v", name, recordDenied), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					a := newAdversary(t, s, recordDenied)
					a.run(t)
					a.check(t)
				})
			})
		}
	}
}

// The adversary's rules, resources and clients: 12 clients of 4 each can
// want 48 units of a resource that admits 40, so both kinds of rule deny.
const (
	advResourceLimit = 40
	advClientLimit   = 4 // the tighter of the per-client rules
	advClients       = 12
	advGoroutines    = 16
	advCalls         = 300 // per goroutine
)

// advResources: the first two are never flushed, so their admissions are
// checked against the limits; the last one is flushed all along.
var advResources = []string{"kept0", "kept1", "flushed"}

// adversary is a local Bucket under attack, and what it admitted on the
// resources nobody flushes, by resource and client.
type adversary struct {
	b            *Bucket
	recordDenied bool
	admitted     [2][advClients]atomic.Int64
}

func newAdversary(t *testing.T, s Strategy, recordDenied bool) *adversary {
	t.Helper()
	opts := []Option{WithStrategy(s),
		PerResource(Per(advResourceLimit, time.Hour)),
		PerClient(Per(6, time.Hour).WithPrecision(exactFor(s))),
		PerClient(Per(advClientLimit, 30*time.Minute))}
	if recordDenied {
		opts = append(opts, WithRecordDenied())
	}
	b, err := NewLocal(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return &adversary{b: b, recordDenied: recordDenied}
}

// run makes advCalls random calls from each of advGoroutines goroutines.
func (a *adversary) run(t *testing.T) {
	var wg sync.WaitGroup
	for g := range advGoroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 19))
			var res Result // one per goroutine, as AllowNInto wants
			for range advCalls {
				if err := a.call(rng, &res); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// call makes one random call: any method, any resource and client.
func (a *adversary) call(rng *rand.Rand, res *Result) error {
	ctx := context.Background()
	r, c, n := rng.IntN(len(advResources)), rng.IntN(advClients), 1+rng.IntN(3)
	resource, client := advResources[r], "c"+strconv.Itoa(c)
	switch k := rng.IntN(20); {
	case k < 6:
		got, err := a.b.AllowN(ctx, resource, client, n)
		return a.admit(r, c, n, got, err)
	case k < 10:
		err := a.b.AllowNInto(ctx, resource, client, n, res)
		return a.admit(r, c, n, *res, err)
	case k < 13:
		_, err := a.b.PeekN(ctx, resource, client, n)
		return err
	case k < 15:
		_, err := a.b.Usage(ctx, resource, client)
		return err
	case k < 17:
		return a.wait(ctx, r, c, n)
	case k < 19:
		return a.b.Flush(ctx, advResources[len(advResources)-1], client)
	default:
		return a.b.FlushAll(ctx, advResources[len(advResources)-1])
	}
}

// wait is WaitN with a deadline of a second: the windows are an hour, so
// a denial returns at once.
func (a *adversary) wait(ctx context.Context, r, c, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err := a.b.WaitN(ctx, advResources[r], "c"+strconv.Itoa(c), n)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return a.admit(r, c, n, Result{Allowed: err == nil}, err)
}

// admit counts an admission on a resource nobody flushes, and checks that
// an admitted call found room under every rule.
func (a *adversary) admit(r, c, n int, res Result, err error) error {
	if err != nil || !res.Allowed {
		return err
	}
	for _, rr := range res.Rules {
		if rr.Used > rr.Rule.Limit.Requests {
			return fmt.Errorf("admitted %d by %s at %s: %v counts %d", n, advResources[r], "c"+strconv.Itoa(c), rr.Rule, rr.Used)
		}
	}
	if r < len(a.admitted) {
		a.admitted[r][c].Add(int64(n))
	}
	return nil
}

// check compares what was admitted on the resources nobody flushed with
// the limits, and (without WithRecordDenied, where denials count too)
// with what each rule counts.
func (a *adversary) check(t *testing.T) {
	t.Helper()
	for r := range a.admitted {
		var total int64
		for c := range a.admitted[r] {
			got := a.admitted[r][c].Load()
			total += got
			if got > advClientLimit {
				t.Errorf("%s, client %d: %d admitted, limit %d", advResources[r], c, got, advClientLimit)
			}
			a.checkUsage(t, advResources[r], "c"+strconv.Itoa(c), got, 1)
		}
		if total > advResourceLimit {
			t.Errorf("%s: %d admitted, limit %d", advResources[r], total, advResourceLimit)
		}
		a.checkUsage(t, advResources[r], "c0", total, 0)
	}
}

// checkUsage checks that rule i counts want at resource for client.
func (a *adversary) checkUsage(t *testing.T, resource, client string, want int64, i int) {
	t.Helper()
	rules, err := a.b.Usage(context.Background(), resource, client)
	if err != nil {
		t.Fatal(err)
	}
	if !a.recordDenied && int64(rules[i].Used) != want {
		t.Errorf("%s, %s: %v counts %d, %d admitted", resource, client, rules[i].Rule, rules[i].Used, want)
	}
}
