package leakybucket

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
)

// sharedEnv is a miniredis on the bubble's fake time, with a client per
// simulated process, whose reads of the limits (HGETALL) are counted and
// can be refused.
type sharedEnv struct {
	m       *miniredis.Miniredis
	reads   atomic.Int64 // HGETALLs served
	tries   atomic.Int64 // HGETALLs received, refused or not
	refuse  atomic.Bool  // answer HGETALL with an error
	clients []*redis.Client
}

func newSharedEnv(t *testing.T) *sharedEnv {
	t.Helper()
	e := &sharedEnv{m: miniredis.NewMiniRedis()}
	e.m.ClockTTL(true)
	if c, err := e.m.Dial(); err != nil { // the server exists from the first Dial on
		t.Fatal(err)
	} else {
		c.Close()
	}
	e.m.Server().SetPreHook(func(c *server.Peer, cmd string, _ ...string) bool {
		if !strings.EqualFold(cmd, "hgetall") {
			return false
		}
		e.tries.Add(1)
		if e.refuse.Load() {
			c.WriteError("ERR refused by the test")
			return true
		}
		e.reads.Add(1)
		return false
	})
	t.Cleanup(func() {
		for _, c := range e.clients {
			c.Close()
		}
		e.m.Close()
	})
	return e
}

// tiers returns a Tiers of its own client, as another process's would be,
// with tier "free" Set to rules, sharing its limits every second.
func (e *sharedEnv) tiers(t *testing.T, s Strategy, rules ...Option) *Tiers {
	t.Helper()
	c := miniClient(e.m)
	e.clients = append(e.clients, c)
	tiers, err := NewTiers(c, WithPrefix("t"), WithStrategy(s), WithSharedLimits(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	mustSet(t, tiers, "free", rules...)
	return tiers
}

// hash returns what the limits' hash holds.
func (e *sharedEnv) hash(t *testing.T) map[string]string {
	t.Helper()
	h, err := e.m.HKeys("t:limits")
	if err != nil && !errors.Is(err, miniredis.ErrKeyNotFound) {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, k := range h {
		m[k] = e.m.HGet("t:limits", k)
	}
	return m
}

func perClientRule(l Limit) Rule { return Rule{PerClient: true, Limit: l} }

// A limit lowered in one process denies at once there what is over it,
// and in another within the refresh interval, not before (it decides by
// its copy); raised, it admits at once, then in the other. No count is
// lost: the remaining room follows the weight admitted so far.
func TestSharedLimitsLowerAndRaise(t *testing.T) {
	t.Parallel()
	for _, s := range []Strategy{Logs, Windows(10 * time.Millisecond), FixedWindows} {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { lowerAndRaise(t, s) })
		})
	}
}

func lowerAndRaise(t *testing.T, s Strategy) {
	ctx := context.Background()
	e := newSharedEnv(t)
	a := e.tiers(t, s, PerClient(PerHour(10)))
	b := e.tiers(t, s, PerClient(PerHour(10)))
	for i := range 6 {
		mustAllow(t, b, "free", true, 10-1-i)
	}
	if err := a.SetLimits(ctx, "free", perClientRule(PerHour(5))); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, a, "free", false, 0) // at once where it was set
	// b read the rules at its first call: until a second has passed since,
	// it decides by them; then by the new one.
	mustAllow(t, b, "free", true, 10-7)
	time.Sleep(time.Second)
	mustAllow(t, b, "free", false, 0)

	if err := b.SetLimits(ctx, "free", perClientRule(PerHour(20))); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, b, "free", true, 20-8)
	time.Sleep(time.Second)
	mustAllow(t, a, "free", true, 20-9)
	if got, want := e.hash(t)["free"], encodeRules([]Rule{perClientRule(PerHour(20))}); got != want {
		t.Errorf("the hash holds %s, want %s", got, want)
	}
}

// Each process reads the hash at most once per refresh interval, however
// many calls it serves; one that cannot read keeps the rules it had, and
// reads again once Redis answers.
func TestSharedLimitsCacheBound(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newSharedEnv(t)
		a := e.tiers(t, Logs, PerClient(PerHour(100)))
		b := e.tiers(t, Logs, PerClient(PerHour(100)))
		for range 50 {
			mustAllowed(t, a, true)
			time.Sleep(10 * time.Millisecond) // 0.5s in all: one read
		}
		if n := e.reads.Load(); n != 1 {
			t.Fatalf("%d reads of the limits in half a refresh interval, want 1", n)
		}
		if err := b.SetLimits(ctx, "free", perClientRule(PerHour(50))); err != nil {
			t.Fatal(err)
		}
		e.refuse.Store(true)
		time.Sleep(time.Second)
		mustAllow(t, a, "free", true, 100-51) // it keeps the rules it had
		// While reads fail, one call per interval tries, not every call.
		tries := e.tries.Load()
		for range 10 {
			mustAllowed(t, a, true)
		}
		if n := e.tries.Load() - tries; n != 0 {
			t.Errorf("%d reads of the limits tried within the interval after a failed one, want 0", n)
		}
		if err := a.Refresh(ctx); err == nil {
			t.Error("Refresh succeeded while Redis refused it")
		}
		e.refuse.Store(false)
		mustAllow(t, a, "free", true, 100-62) // tried again a second later, not sooner
		time.Sleep(time.Second)
		mustAllow(t, a, "free", false, 0)

		// A call that gave up on its read makes the interval start too:
		// the calls after it do not each read (during an outage, each
		// would spend its deadline on it).
		time.Sleep(time.Second)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := a.Allow(ended, "free", "GET /", "c"); err == nil {
			t.Fatal("a call with an ended context succeeded")
		}
		tries = e.tries.Load()
		for range 5 {
			mustAllowed(t, a, false)
		}
		if n := e.tries.Load() - tries; n != 0 {
			t.Errorf("%d reads of the limits within the interval of a read given up on, want 0", n)
		}
	})
}

// mustAllowed makes one call of tier "free" and checks only the verdict.
func mustAllowed(t *testing.T, tiers *Tiers, allowed bool) {
	t.Helper()
	res, err := tiers.Allow(context.Background(), "free", "GET /", "c")
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed != allowed {
		t.Fatalf("Allow = %+v, want allowed %v", res, allowed)
	}
}

// A process that starts after a change decides by it from its first call,
// though its code says otherwise; a tier's rules in code are written to
// the hash by the first process that reads it, and never over a change.
func TestSharedLimitsStartAfterChange(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newSharedEnv(t)
		a := e.tiers(t, Logs, PerClient(PerHour(10)))
		mustAllow(t, a, "free", true, 9)
		if got, want := e.hash(t)["free"], encodeRules([]Rule{perClientRule(PerHour(10))}); got != want {
			t.Fatalf("after a first read the hash holds %q, want the code's rules %s", got, want)
		}
		if err := a.SetLimits(ctx, "free", perClientRule(PerHour(2))); err != nil {
			t.Fatal(err)
		}
		b := e.tiers(t, Logs, PerClient(PerHour(10)))
		mustAllow(t, b, "free", true, 0)
		mustAllow(t, b, "free", false, 0)
		if got, want := e.hash(t)["free"], encodeRules([]Rule{perClientRule(PerHour(2))}); got != want {
			t.Errorf("the hash holds %q, want the change %s", got, want)
		}
		// A tier whose rules have another shape in this process's code
		// follows its code: the stored rules would count in other keys.
		c := e.tiers(t, Logs, PerClient(PerMinute(3)))
		mustAllow(t, c, "free", true, 2)
	})
}

// Bad input is a matchable error, and writes nothing.
func TestSharedLimitsInvalid(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newSharedEnv(t)
		a := e.tiers(t, Windows(time.Second), PerClient(PerHour(10)), PerResource(PerHour(100)))
		mustAllow(t, a, "free", true, 9)
		before := e.hash(t)
		good := []Rule{perClientRule(PerHour(5)), {Limit: PerHour(50)}}
		for _, tc := range []struct {
			name  string
			tier  string
			rules []Rule
			want  error
		}{
			{"a limit of 0", "free", []Rule{perClientRule(PerHour(0)), {Limit: PerHour(50)}}, ErrInvalidOption},
			{"a negative limit", "free", []Rule{perClientRule(PerHour(5)), {Limit: PerHour(-1)}}, ErrInvalidOption},
			{"an unknown tier", "gold", good, ErrUnknownTier},
			{"an empty tier", "", good, ErrInvalidOption},
			{"no rule", "free", nil, ErrInvalidOption},
			{"one rule of two", "free", good[:1], ErrInvalidOption},
			{"another window", "free", []Rule{perClientRule(PerMinute(5)), {Limit: PerHour(50)}}, ErrInvalidOption},
			{"another scope", "free", []Rule{{Limit: PerHour(5)}, {Limit: PerHour(50)}}, ErrInvalidOption},
			{"a precision", "free", []Rule{perClientRule(PerHour(5).WithPrecision(time.Minute)), {Limit: PerHour(50)}}, ErrInvalidOption},
		} {
			if err := a.SetLimits(ctx, tc.tier, tc.rules...); !errors.Is(err, tc.want) {
				t.Errorf("SetLimits(%s): err = %v, want %v", tc.name, err, tc.want)
			}
		}
		if after := e.hash(t); !maps.Equal(before, after) {
			t.Errorf("refused changes wrote the hash: %v, was %v", after, before)
		}
		mustAllow(t, a, "free", true, 8)
		if _, err := NewTiers(e.clients[0], WithSharedLimits(-time.Second)); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("WithSharedLimits(-1s): err = %v, want ErrInvalidOption", err)
		}
	})
}

// The strategies whose counts are named by their limit cannot share
// limits, nor change them: a change would start every count from zero and
// admit a full new limit on top of what a client just used.
func TestSharedLimitsRefusesStrategies(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newSharedEnv(t)
		c := miniClient(e.m)
		e.clients = append(e.clients, c)
		for _, s := range []Strategy{SortedSet, GCRA} {
			shared, err := NewTiers(c, WithPrefix("t"), WithStrategy(s), WithSharedLimits(0))
			if err != nil {
				t.Fatal(err)
			}
			if err := shared.Set("free", PerClient(PerHour(10))); !errors.Is(err, ErrInvalidOption) {
				t.Errorf("%v: Set with WithSharedLimits: err = %v, want ErrInvalidOption", s, err)
			}
			plain, err := NewTiers(c, WithPrefix("t"), WithStrategy(s))
			if err != nil {
				t.Fatal(err)
			}
			mustSet(t, plain, "free", PerClient(PerHour(10)))
			if err := plain.SetLimits(ctx, "free", perClientRule(PerHour(5))); !errors.Is(err, ErrInvalidOption) {
				t.Errorf("%v: SetLimits: err = %v, want ErrInvalidOption", s, err)
			}
		}
		if h := e.hash(t); len(h) != 0 {
			t.Errorf("refused changes wrote the hash: %v", h)
		}
	})
}

// A Tiers that defines no tier, as the ops command's, changes the limits
// of a tier that a process wrote to the hash, and reads them all.
func TestSharedLimitsWithoutTiers(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		e := newSharedEnv(t)
		a := e.tiers(t, Logs, PerClient(PerHour(10)))
		c := miniClient(e.m)
		e.clients = append(e.clients, c)
		ops, err := NewTiers(c, WithPrefix("t"))
		if err != nil {
			t.Fatal(err)
		}
		if err := ops.SetLimits(ctx, "free", perClientRule(PerHour(3))); !errors.Is(err, ErrUnknownTier) {
			t.Fatalf("SetLimits before any process wrote the tier: err = %v, want ErrUnknownTier", err)
		}
		mustAllow(t, a, "free", true, 9) // its first read writes the tier
		if err := ops.SetLimits(ctx, "free", perClientRule(PerHour(3))); err != nil {
			t.Fatal(err)
		}
		got, err := ops.Limits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := []Rule{perClientRule(PerHour(3))}; len(got) != 1 || !sameShape(got["free"], want) || got["free"][0] != want[0] {
			t.Errorf("Limits() = %v, want free: %v", got, want)
		}
		if err := a.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		mustAllow(t, a, "free", true, 1)
	})
}

// In process (NewLocalTiers), SetLimits changes a tier's limits at once,
// keeping every count, as on Redis; bad input changes nothing.
func TestLocalTiersSetLimits(t *testing.T) {
	t.Parallel()
	for _, s := range []Strategy{Logs, Windows(10 * time.Millisecond), FixedWindows} {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { localSetLimits(t, s) })
		})
	}
}

func localSetLimits(t *testing.T, s Strategy) {
	ctx := context.Background()
	tiers, err := NewLocalTiers(WithStrategy(s))
	if err != nil {
		t.Fatal(err)
	}
	mustSet(t, tiers, "free", PerClient(PerHour(10)))
	for i := range 6 {
		mustAllow(t, tiers, "free", true, 10-1-i)
	}
	if err := tiers.SetLimits(ctx, "free", perClientRule(PerHour(5))); err != nil {
		t.Fatal(err)
	}
	res, err := tiers.Allow(ctx, "free", "GET /", "c")
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Remaining != 0 || res.RetryAfter <= 0 {
		t.Fatalf("after lowering to 5 with 6 used: %+v, want denied with a RetryAfter", res)
	}
	for _, bad := range [][]Rule{{perClientRule(PerHour(0))}, {perClientRule(PerMinute(5))}, {{Limit: PerHour(5)}}} {
		if err := tiers.SetLimits(ctx, "free", bad...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("SetLimits(%v): err = %v, want ErrInvalidOption", bad, err)
		}
	}
	if err := tiers.SetLimits(ctx, "gold", perClientRule(PerHour(5))); !errors.Is(err, ErrUnknownTier) {
		t.Errorf("SetLimits(gold): err = %v, want ErrUnknownTier", err)
	}
	if err := tiers.SetLimits(ctx, "free", perClientRule(PerHour(20))); err != nil {
		t.Fatal(err)
	}
	mustAllow(t, tiers, "free", true, 20-7)
	got, err := tiers.Limits(ctx)
	if err != nil || len(got) != 1 || got["free"][0] != perClientRule(PerHour(20)) {
		t.Errorf("Limits() = %v, %v; want free: %v", got, err, perClientRule(PerHour(20)))
	}
	// A Set of rules that differ in Requests only keeps the counts too;
	// as on Redis, the limits SetLimits set decide over the code's.
	mustSet(t, tiers, "free", PerClient(PerHour(8)))
	mustAllow(t, tiers, "free", true, 20-8)
}

// The strategies whose counts depend on the limit are refused in process
// too, as on Redis: the same rules behave the same on both.
func TestLocalTiersRefusesStrategies(t *testing.T) {
	t.Parallel()
	for _, s := range []Strategy{SortedSet, GCRA} {
		tiers, err := NewLocalTiers(WithStrategy(s))
		if err != nil {
			t.Fatal(err)
		}
		mustSet(t, tiers, "free", PerClient(PerHour(10)))
		if err := tiers.SetLimits(context.Background(), "free", perClientRule(PerHour(5))); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%v: SetLimits: err = %v, want ErrInvalidOption", s, err)
		}
	}
}

// Calls race with changes of the limit in process: no data race, and no
// more admitted in the window than the highest limit it had.
func TestLocalTiersSetLimitsWhileServing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		tiers, err := NewLocalTiers()
		if err != nil {
			t.Fatal(err)
		}
		mustSet(t, tiers, "free", PerResource(PerHour(30)))
		var admitted atomic.Int64
		done := make(chan struct{})
		for range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				for range 50 {
					res, err := tiers.Allow(ctx, "free", "r", "c")
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
		for i := range 20 {
			if err := tiers.SetLimits(ctx, "free", Rule{Limit: PerHour(20 + i%2*20)}); err != nil {
				t.Error(err)
			}
		}
		for range 4 {
			<-done
		}
		if n := admitted.Load(); n > 40 {
			t.Errorf("%d admitted in an hour, above every limit it had (at most 40)", n)
		}
	})
}
