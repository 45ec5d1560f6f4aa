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
	eachAttack(t, Windows(time.Minute), func(t *testing.T, s Strategy, recordDenied bool) {
		a := newAdversary(t, s, recordDenied)
		a.run(t)
		a.check(t)
	})
}

// eachAttack runs attack in a synctest bubble with every strategy (windows
// the Windows one), with and without WithRecordDenied.
func eachAttack(t *testing.T, windows Strategy, attack func(t *testing.T, s Strategy, recordDenied bool)) {
	configs := map[string]Strategy{"logs": Logs, "sorted set": SortedSet, "windows": windows, "fixed windows": FixedWindows}
	for name, s := range configs {
		for _, recordDenied := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recordDenied=%v", name, recordDenied), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { attack(t, s, recordDenied) })
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
	b := newLocalOf(t, recordDenied, WithStrategy(s),
		PerResource(Per(advResourceLimit, time.Hour)),
		PerClient(Per(6, time.Hour).WithPrecision(exactFor(s))),
		PerClient(Per(advClientLimit, 30*time.Minute)))
	return &adversary{b: b, recordDenied: recordDenied}
}

// newLocalOf is NewLocal(opts...), WithRecordDenied too if recordDenied.
func newLocalOf(t *testing.T, recordDenied bool, opts ...Option) *Bucket {
	t.Helper()
	if recordDenied {
		opts = append(opts, WithRecordDenied())
	}
	b, err := NewLocal(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
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

// The adversary of a local Bucket as time moves: every method at once, on
// a clock that runs (a synctest bubble's, so that each call is decided at
// the instant it reads), where calls leave their windows and the counts
// drop, reuse and move the room of their calls. On two resources nobody
// flushes, a client hammers past its own limits from two goroutines
// beside eight polite clients of each, while others Peek, ask Usage, and
// call, Flush and FlushAll a third resource. No rule may admit more than
// its limit in any of its windows (any span of its Window, or under
// FixedWindows each multiple of it since the epoch); and without
// WithRecordDenied, the hammer's denied weight occupies no room, so every
// call of the polite clients, whose demand and the hammer's limit fit the
// resource's, is admitted.
func TestLocalExactAsTimeMoves(t *testing.T) {
	eachAttack(t, Windows(10*time.Millisecond), func(t *testing.T, s Strategy, recordDenied bool) {
		m := newMovingAdversary(t, s, recordDenied)
		m.run(t)
		m.check(t, s == FixedWindows)
	})
}

// The moving adversary's rules, in the order given to NewLocal: a polite
// client calls at most once in movingGap (plus up to 10 ms), so at most 4
// of its calls fall in 200 ms (in 209, under Windows(10ms), whose stamps
// run up to 9 ms late), 2 in 100 ms: 8 of them and the hammer's 6 fit the
// resource's 40.
var movingRules = []Limit{Per(40, 200*time.Millisecond), Per(6, 200*time.Millisecond), Per(4, 100*time.Millisecond)}

const (
	movingGap      = 60 * time.Millisecond
	movingPolite   = 8 // polite clients of each resource
	movingDuration = 2 * time.Second
)

// movingAdversary is a local Bucket under attack as time moves, and the
// calls it admitted on the resources nobody flushes.
type movingAdversary struct {
	b            *Bucket
	recordDenied bool
	mu           sync.Mutex
	admitted     []scopedAdmission
	politeDenied atomic.Int64
}

// scopedAdmission is an admitted call, and whose, where: its span is the
// instant it was decided.
type scopedAdmission struct {
	resource, client string
	admission
}

func newMovingAdversary(t *testing.T, s Strategy, recordDenied bool) *movingAdversary {
	t.Helper()
	b := newLocalOf(t, recordDenied, WithStrategy(s), PerResource(movingRules[0]), PerClient(movingRules[1]), PerClient(movingRules[2]))
	return &movingAdversary{b: b, recordDenied: recordDenied}
}

// run runs every goroutine of the attack for movingDuration.
func (m *movingAdversary) run(t *testing.T) {
	var wg sync.WaitGroup
	end := time.Now().Add(movingDuration)
	loop := func(seed uint64, step func(rng *rand.Rand, res *Result) error) {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, 23))
			var res Result
			for time.Now().Before(end) {
				if err := step(rng, &res); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for r := range 2 {
		for c := range movingPolite {
			loop(uint64(r*movingPolite+c), func(rng *rand.Rand, res *Result) error {
				time.Sleep(movingGap + time.Duration(rng.IntN(11))*time.Millisecond)
				return m.polite(rng, advResources[r], "p"+strconv.Itoa(c), res)
			})
		}
	}
	for g := range 2 {
		loop(uint64(100+g), func(rng *rand.Rand, res *Result) error {
			time.Sleep(time.Millisecond)
			return m.hammer(rng, res)
		})
	}
	loop(200, func(rng *rand.Rand, res *Result) error {
		time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		return m.bystander(rng, res)
	})
	wg.Wait()
}

// polite makes one call of weight 1 by client, by any of the deciding
// methods: each must be admitted unless the hammer's denials count.
func (m *movingAdversary) polite(rng *rand.Rand, resource, client string, res *Result) error {
	ctx := context.Background()
	var err error
	switch rng.IntN(3) {
	case 0:
		*res, err = m.b.Allow(ctx, resource, client)
	case 1:
		err = m.b.AllowNInto(ctx, resource, client, 1, res)
	default:
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err = m.b.Wait(ctx, resource, client)
		*res = Result{Allowed: err == nil}
		if errors.Is(err, context.DeadlineExceeded) {
			err = nil
		}
	}
	if err == nil && !res.Allowed {
		m.politeDenied.Add(1)
	}
	return m.note(resource, client, 1, *res, err)
}

// hammer makes one call of weight 1-3 by the hammer, to either resource.
func (m *movingAdversary) hammer(rng *rand.Rand, res *Result) error {
	resource, n := advResources[rng.IntN(2)], 1+rng.IntN(3)
	err := m.b.AllowNInto(context.Background(), resource, "hammer", n, res)
	return m.note(resource, "hammer", n, *res, err)
}

// bystander reads the resources nobody flushes, or calls, flushes and
// flushes all of the one that is.
func (m *movingAdversary) bystander(rng *rand.Rand, res *Result) error {
	ctx := context.Background()
	flushed, client := advResources[2], "c"+strconv.Itoa(rng.IntN(4))
	switch k := rng.IntN(10); {
	case k < 2:
		_, err := m.b.PeekN(ctx, advResources[rng.IntN(2)], "hammer", 1+rng.IntN(3))
		return err
	case k < 3:
		_, err := m.b.Usage(ctx, advResources[rng.IntN(2)], "p"+strconv.Itoa(rng.IntN(movingPolite)))
		return err
	case k < 7:
		return m.b.AllowNInto(ctx, flushed, client, 1+rng.IntN(3), res)
	case k < 9:
		return m.b.Flush(ctx, flushed, client)
	default:
		return m.b.FlushAll(ctx, flushed)
	}
}

// note keeps an admitted call, at the time it was decided: in the bubble
// no time passes during a call once it decides.
func (m *movingAdversary) note(resource, client string, n int, res Result, err error) error {
	if err != nil || !res.Allowed {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.admitted = append(m.admitted, scopedAdmission{resource, client, admission{start: now, reply: now, weight: n}})
	return nil
}

// check checks every rule's windows, and the polite clients' calls.
func (m *movingAdversary) check(t *testing.T, fixed bool) {
	t.Helper()
	for i, rule := range movingRules {
		scopes := map[string][]admission{}
		for _, a := range m.admitted {
			scope := a.resource + " " + a.client
			if i == 0 {
				scope = a.resource
			}
			scopes[scope] = append(scopes[scope], a.admission)
		}
		for scope, admitted := range scopes {
			if worst, at := worstIn(admitted, rule.Window, decidedAt, fixed); worst > rule.Requests {
				t.Errorf("%v: %d admitted to %s in the window from %v", rule, worst, scope, at)
			}
		}
	}
	if n := m.politeDenied.Load(); n > 0 && !m.recordDenied {
		t.Errorf("%d calls of the polite clients denied: the hammer's denied calls took their room", n)
	}
	if len(m.admitted) == 0 {
		t.Error("nothing admitted")
	}
}

// decidedAt is the span of a call decided in a synctest bubble: the
// instant it started, when it was also decided and returned.
func decidedAt(a admission) (from, to time.Time) { return a.start, a.reply }
