package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// step is one call of a step table: wait, then AllowN (or PeekN) and check.
type step struct {
	wait   time.Duration
	client string
	n      int
	peek   bool
	want   want
}

type want struct {
	allowed    bool
	remaining  int
	retryAfter time.Duration
	resetAfter time.Duration
	deniedBy   []Rule
}

// run makes the calls of steps in order, each after its wait, and checks
// each Result against the model: a clock that starts when the env is made
// and moves by the steps' waits, and nothing else.
//
// On fake time (miniredis in a synctest bubble) the model is the clock, and
// every Result must be exactly the step's. On a real clock each call lands
// late by lag: the real time since the env was made beyond the model's,
// which a loaded machine can make as long as it likes. Since the waits are
// real sleeps, a call is never closer to an earlier one than the model
// says, so a call the model has left a window has left it for real too; but
// lag can move a call out of a window the model still counts it in. So each
// call is timed, before and after, and:
//
//   - if the time between an earlier recorded call and this one, measured
//     at its widest, reaches within 1ms of a window the model still counts
//     it in, the step is void: run panics with a *lateCall, and onTime runs
//     the whole test again on a fresh prefix;
//   - else the model counts exactly what Redis counts: Allowed, Remaining
//     and DeniedBy must be the step's, and RetryAfter and ResetAfter, which
//     are measured from the calls they wait for, lie between the step's
//     value less the lag measured after the call (less 1ms for Redis time's
//     whole milliseconds) and the step's value.
func (e *env) run(t *testing.T, b *Bucket, resource string, steps []step) {
	t.Helper()
	e.runWith(t, b, steps, func(s step) (Result, error) { return s.call(b, resource) })
}

// runWith is run, each step's call made by call.
func (e *env) runWith(t *testing.T, b *Bucket, steps []step, call func(step) (Result, error)) {
	t.Helper()
	for i, s := range steps {
		time.Sleep(s.wait)
		e.clock.now += s.wait
		before := time.Now()
		got, err := call(s)
		after := time.Now()
		desc := fmt.Sprintf("step %d: %s at %v", i, s, e.clock.now)
		if err != nil {
			t.Fatalf("%s: %v", desc, err)
		}
		e.check(t, desc, got, s.want, e.lag(t, b, desc, after))
		if !s.peek && (s.want.allowed || b.cfg.recordDenied) {
			e.clock.record(b, before)
		}
	}
}

func (s step) call(b *Bucket, resource string) (Result, error) {
	if s.peek {
		return b.PeekN(context.Background(), resource, s.client, s.n)
	}
	return b.AllowN(context.Background(), resource, s.client, s.n)
}

func (s step) String() string {
	if s.peek {
		return fmt.Sprintf("PeekN(%q, n=%d)", s.client, s.n)
	}
	return fmt.Sprintf("AllowN(%q, n=%d)", s.client, s.n)
}

// lag returns how much shorter than the model's a duration in the Result
// of the call of b described by desc, which ended at after, may be; it
// voids the attempt if the call landed too late for the model (see run).
func (e *env) lag(t *testing.T, b *Bucket, desc string, after time.Time) time.Duration {
	t.Helper()
	late := e.clock.late(b, after)
	switch {
	case late != "" && e.real:
		panic(&lateCall{desc + ": " + late})
	case late != "":
		t.Fatalf("%s on fake time: %s", desc, late)
	case !e.real:
		return 0
	}
	return after.Sub(e.clock.start) - e.clock.now + ms
}

// modelClock is the model time of an env's run steps, and the calls they
// recorded. Calls made outside run are not tracked: a test that makes them
// gives them windows far longer than it lasts.
type modelClock struct {
	start    time.Time     // before the env's first call
	now      time.Duration // the model's time: the steps' waits so far
	recorded []modelCall
	// spans are the intervals the rules count in (Windows), when the
	// model starts at a multiple of them all: see env.align.
	spans []time.Duration
}

// align starts the model afresh at the next multiple of the longest of
// spans since the Unix epoch (at once on fake time, which starts at
// midnight), where fixed windows and intervals begin, so that a step's
// interval is the same in the model and in Redis; the other spans must
// divide the longest. On a real clock a call that landed in another
// interval voids the attempt (see late).
func (e *env) align(spans ...time.Duration) {
	longest := slices.Max(spans)
	now := time.Now()
	start := now.Add(-(time.Duration(now.UnixNano()) % longest))
	if start.Before(now) {
		start = start.Add(longest)
	}
	time.Sleep(time.Until(start))
	// The model starts at the multiple, not when the sleep ended: the
	// oversleep is lag like any other.
	e.clock = modelClock{start: start, spans: spans}
}

// modelCall is a call recorded by a step: its Bucket, its model time, and
// the real time before it was made.
type modelCall struct {
	b      *Bucket
	at     time.Duration
	before time.Time
}

func newModelClock() modelClock { return modelClock{start: time.Now()} }

func (c *modelClock) record(b *Bucket, before time.Time) {
	c.recorded = append(c.recorded, modelCall{b, c.now, before})
}

// late says why a call of b that ended at after may have missed a call that
// the model counts in a window of b's rules, or "" if it cannot have.
func (c *modelClock) late(b *Bucket, after time.Time) string {
	for _, span := range c.spans {
		// Time in a later interval than the model's, or so close to its
		// end that the estimate of Redis time may be past it, changes
		// every stamp of the call.
		if real := after.Sub(c.start); real/span != c.now/span || real%span >= span-2*ms {
			return fmt.Sprintf("it ended at %v, not in the interval of %v of the model's %v", real, span, c.now)
		}
	}
	for _, r := range c.recorded {
		if r.b != b {
			continue
		}
		for _, rule := range b.cfg.rules {
			w := rule.Limit.Window
			if c.now-r.at < w && after.Sub(r.before) >= w-ms {
				return fmt.Sprintf("the call of %v counts in %v, but up to %v passed since it", r.at, rule.Limit, after.Sub(r.before))
			}
		}
	}
	return ""
}

// lateCall voids an attempt of a test on a real clock: a call landed too
// late for the model (see env.run).
type lateCall struct{ why string }

func (l *lateCall) String() string { return l.why }

// maxAttempts bounds how many times onTime runs a test.
const maxAttempts = 8

// onTime runs test on an env from newEnv, and again on a new one (a fresh
// prefix) each time a step's call lands too late for the model, at most
// maxAttempts times in all.
func onTime(t *testing.T, newEnv func() *env, test func(*testing.T, *env)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		late := attemptOnTime(t, newEnv(), test)
		if late == nil {
			return
		}
		if attempt == maxAttempts {
			t.Fatalf("attempt %d of %d void too: %v", attempt, maxAttempts, late)
		}
		t.Logf("attempt %d void, run again on a fresh prefix: %v", attempt, late)
	}
}

// attemptOnTime runs test on e, and returns the *lateCall that voided it,
// if any.
func attemptOnTime(t *testing.T, e *env, test func(*testing.T, *env)) (late *lateCall) {
	defer func() {
		if r := recover(); r != nil {
			var ok bool
			if late, ok = r.(*lateCall); !ok {
				panic(r)
			}
		}
	}()
	test(t, e)
	return nil
}

// check compares a Result with the model. Durations must be the step's, or
// up to lag shorter (see run).
func (e *env) check(t *testing.T, call string, got Result, w want, lag time.Duration) {
	t.Helper()
	near := func(got, want time.Duration) bool { return got <= want && got >= want-lag }
	if got.Allowed != w.allowed || got.Remaining != w.remaining ||
		!near(got.RetryAfter, w.retryAfter) || !near(got.ResetAfter, w.resetAfter) ||
		!slices.Equal(got.DeniedBy, w.deniedBy) {
		t.Errorf("%s = {Allowed:%v Remaining:%d RetryAfter:%v ResetAfter:%v DeniedBy:%v}, want {%v %d %v %v %v} (durations up to %v less)",
			call, got.Allowed, got.Remaining, got.RetryAfter, got.ResetAfter, got.DeniedBy,
			w.allowed, w.remaining, w.retryAfter, w.resetAfter, w.deniedBy, lag)
	}
	if w.allowed && got.RetryAfter != 0 {
		t.Errorf("%s: RetryAfter = %v, want 0 when allowed", call, got.RetryAfter)
	}
}

const ms = time.Millisecond

func TestAllowOneRule(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(3, time.Second)))
		deny := []Rule{{PerClient: true, Limit: Per(3, time.Second)}}
		e.run(t, b, "r", []step{
			{0, "a", 1, false, want{true, 2, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{300 * ms, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			// t=500: the logs of t=0 leave at 1000, the last at 1300.
			{200 * ms, "a", 1, false, want{false, 0, 500 * ms, 800 * ms, deny}},
			// t=1000: both logs of t=0 are gone.
			{500 * ms, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{false, 0, 300 * ms, time.Second, deny}},
			{300 * ms, "a", 1, false, want{true, 0, 0, time.Second, nil}},
		})
	})
}

func TestAllowNWeights(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(5, time.Second)))
		deny := []Rule{{PerClient: true, Limit: Per(5, time.Second)}}
		e.run(t, b, "r", []step{
			{0, "a", 3, false, want{true, 2, 0, time.Second, nil}},
			// Weight 3 does not fit in 2: denied, and nothing recorded.
			{400 * ms, "a", 3, false, want{false, 2, 600 * ms, 600 * ms, deny}},
			{0, "a", 2, false, want{true, 0, 0, time.Second, nil}},
			// t=1000: 2 left from t=400; 5 fits once they leave at 1400.
			{600 * ms, "a", 5, false, want{false, 3, 400 * ms, 400 * ms, deny}},
			{0, "a", 3, false, want{true, 0, 0, time.Second, nil}},
			{400 * ms, "a", 5, true, want{false, 2, 600 * ms, 600 * ms, deny}},
			{0, "a", 2, true, want{true, 0, 0, time.Second, nil}},
		})
	})
}

// The notification sender: all clients together at most 5, each at most 2.
// A request denied at one level is recorded at none.
func TestHierarchy(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		total, each := Per(5, time.Second), Per(2, time.Second)
		b := e.bucket(t, PerResource(total), PerClient(each))
		byClient := []Rule{{PerClient: true, Limit: each}}
		byTotal := []Rule{{Limit: total}}
		e.run(t, b, "notify", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{false, 0, time.Second, time.Second, byClient}},
			{0, "b", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "b", 1, false, want{true, 0, 0, time.Second, nil}},
			// The denied third call of a was not counted in the total.
			{0, "c", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "c", 1, false, want{false, 0, time.Second, time.Second, byTotal}},
			{0, "d", 1, true, want{false, 0, time.Second, time.Second, byTotal}},
			{0, "d", 2, true, want{false, 0, time.Second, time.Second, byTotal}},
		})
	})
}

// Several windows on one client: 2 per 200ms and 3 per second.
func TestSeveralWindows(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		short, long := Per(2, 200*ms), Per(3, time.Second)
		b := e.bucket(t, PerClient(short), PerClient(long))
		e.run(t, b, "api", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, false, want{false, 0, 200 * ms, time.Second, []Rule{{PerClient: true, Limit: short}}}},
			{200 * ms, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			// t=400: the short window is empty, the long one full until 1000.
			{200 * ms, "a", 1, false, want{false, 0, 600 * ms, 800 * ms, []Rule{{PerClient: true, Limit: long}}}},
			{600 * ms, "a", 1, false, want{true, 1, 0, time.Second, nil}},
		})
	})
}

// Every (resource, client) pair has a count of its own, whatever characters
// the strings hold: glob metacharacters, separators, braces.
func TestNamesNeverShareACount(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		resources := []string{"r", "*", "r*", "{r}", "r}", "{", ":", `\*`, "lock", "r:log:a"}
		clients := []string{"a", "*", "a*", "{a}", ":", "a:b", `\`, "?", "[a]", "é\x00"}
		b := e.bucket(t, PerClient(Per(1, time.Minute)))
		for call := 1; call <= 2; call++ {
			for _, r := range resources {
				for _, c := range clients {
					res, err := b.Allow(ctx, r, c)
					if err != nil {
						t.Fatalf("Allow(%q, %q): %v", r, c, err)
					}
					if res.Allowed != (call == 1) {
						t.Errorf("call %d of Allow(%q, %q): Allowed = %v", call, r, c, res.Allowed)
					}
				}
			}
		}
		shared := e.bucket(t, WithPrefix(e.prefix+"-shared"), PerResource(Per(1, time.Minute)))
		for _, r := range resources {
			if res, err := shared.Allow(ctx, r, ""); err != nil || !res.Allowed {
				t.Errorf("per-resource Allow(%q) = %v, %v; want allowed", r, res.Allowed, err)
			}
		}
		if err := shared.FlushAll(ctx, resources[0]); err != nil {
			t.Fatal(err)
		}
		for _, r := range resources {
			res, err := shared.Peek(ctx, r, "")
			if err != nil || res.Allowed != (r == resources[0]) {
				t.Errorf("after FlushAll(%q): Peek(%q).Allowed = %v, %v", resources[0], r, res.Allowed, err)
			}
		}
	})
}

func TestPeekRecordsNothing(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(Per(2, time.Second)))
		deny := []Rule{{PerClient: true, Limit: Per(2, time.Second)}}
		peeks := []step{}
		for range 5 {
			peeks = append(peeks, step{0, "a", 1, true, want{true, 1, 0, time.Second, nil}})
		}
		e.run(t, b, "r", peeks)
		if keys := e.keys(t); len(keys) != 0 {
			t.Errorf("keys after 5 peeks: %q, want none", keys)
		}
		e.run(t, b, "r", []step{
			{0, "a", 1, false, want{true, 1, 0, time.Second, nil}},
			{0, "a", 2, true, want{false, 1, time.Second, time.Second, deny}},
			{0, "a", 1, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 1, true, want{false, 0, time.Second, time.Second, deny}},
		})
	})
}

func TestFlush(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		total, each := Per(3, time.Minute), Per(2, time.Minute)
		b := e.bucket(t, PerResource(total), PerClient(each))
		for _, c := range []string{"a", "a", "b"} {
			if res, err := b.Allow(ctx, "r", c); err != nil || !res.Allowed {
				t.Fatalf("Allow(%q) = %+v, %v", c, res, err)
			}
		}
		if res, _ := b.Peek(ctx, "r", "c"); res.Allowed {
			t.Fatalf("Peek(c) allowed with the total full")
		}
		// Flush forgets a's own count and its share of the total.
		if err := b.Flush(ctx, "r", "a"); err != nil {
			t.Fatal(err)
		}
		e.run(t, b, "r", []step{
			{0, "c", 1, false, want{true, 1, 0, time.Minute, nil}},
			{0, "a", 1, false, want{true, 0, 0, time.Minute, nil}},
			{0, "b", 1, true, want{false, 0, time.Minute, time.Minute, []Rule{{Limit: total}}}},
		})
		if err := b.FlushAll(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if keys := e.countKeys(t); len(keys) != 0 {
			t.Errorf("keys after FlushAll: %q", keys)
		}
		e.run(t, b, "r", []step{{0, "b", 2, false, want{true, 0, 0, time.Minute, nil}}})
	})
}

// Bad input gets a clear error and sends nothing, so writes nothing.
func TestBadInput(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, tc := range []struct {
			opts []Option
			want error
			says string // in the error's text, which tells the cases apart
		}{
			{nil, ErrInvalidOption, "invalid option: no rule"},
			{[]Option{nil}, ErrInvalidOption, "invalid option: no rule"},
			{[]Option{PerClient(Per(0, time.Second))}, ErrInvalidOption, "invalid option: limit"},
			{[]Option{PerClient(Per(-1, time.Second))}, ErrInvalidOption, "invalid option: limit"},
			{[]Option{PerResource(Per(1, 999*time.Microsecond))}, ErrInvalidOption, "invalid option: limit"},
			{[]Option{PerResource(Per(1, -time.Second))}, ErrInvalidOption, "invalid option: limit"},
			{[]Option{PerClient(PerSecond(1)), PerResource(Limit{})}, ErrInvalidOption, "invalid option: limit"},
			{[]Option{PerClient(PerSecond(1)), WithPrefix("")}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithPrefix("a{b")}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithPrefix("}")}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithLockTTL(0)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithLockWait(-time.Millisecond, 0)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithLockWait(2*time.Millisecond, time.Millisecond)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithScanCount(0)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(nil)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(Windows(999 * time.Microsecond))}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(Windows(-time.Second))}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerMinute(1)), PerResource(PerSecond(1)), WithStrategy(Windows(2 * time.Second))}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithReplicas(-1, time.Second)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithReplicas(1, 0)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithReplicas(1, 999*time.Microsecond)}, ErrInvalidOption, ""},
			{[]Option{PerClient(PerSecond(1)), WithReplicas(2, -time.Second)}, ErrInvalidOption, ""},
		} {
			if _, err := e.new(tc.opts...); !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.says) {
				t.Errorf("New(%d options) error = %v, want %v saying %q", len(tc.opts), err, tc.want, tc.says)
			}
		}
		if _, err := New(nil, PerClient(PerSecond(1))); !errors.Is(err, ErrUnsupportedClient) {
			t.Errorf("New(nil) error = %v, want ErrUnsupportedClient", err)
		}

		both := e.bucket(t, PerResource(Per(10, time.Minute)), PerClient(Per(3, time.Minute)))
		resourceOnly := e.bucket(t, PerResource(Per(10, time.Minute)))
		calls := []struct {
			name string
			call func() error
			want error
		}{
			{"AllowN empty resource", func() error { _, err := both.AllowN(ctx, "", "a", 1); return err }, ErrEmptyResource},
			{"AllowN empty client", func() error { _, err := both.AllowN(ctx, "r", "", 1); return err }, ErrEmptyClient},
			{"AllowN n=0", func() error { _, err := both.AllowN(ctx, "r", "a", 0); return err }, ErrInvalidWeight},
			{"AllowN n<0", func() error { _, err := both.AllowN(ctx, "r", "a", -2); return err }, ErrInvalidWeight},
			{"Peek empty client", func() error { _, err := both.Peek(ctx, "r", ""); return err }, ErrEmptyClient},
			{"Flush empty resource", func() error { return both.Flush(ctx, "", "a") }, ErrEmptyResource},
			{"Flush empty client", func() error { return both.Flush(ctx, "r", "") }, ErrEmptyClient},
			{"FlushAll empty resource", func() error { return both.FlushAll(ctx, "") }, ErrEmptyResource},
		}
		for _, c := range calls {
			var err error
			if trips := e.trips.count(func() { err = c.call() }); trips != 0 {
				t.Errorf("%s: %d round trips, want none", c.name, trips)
			}
			if !errors.Is(err, c.want) || !strings.HasPrefix(err.Error(), "leakybucket: ") {
				t.Errorf("%s: error %v, want %v", c.name, err, c.want)
			}
		}
		if keys := e.keys(t); len(keys) != 0 {
			t.Errorf("bad input wrote %q", keys)
		}
		// A weight above a rule's Requests is not bad input: a denial that
		// no wait lifts (TestNeverFits), which writes nothing either.
		for name, call := range map[string]func() (Result, error){
			"AllowN n above a rule": func() (Result, error) { return both.AllowN(ctx, "r", "a", 4) },
			"PeekN n above a rule":  func() (Result, error) { return resourceOnly.PeekN(ctx, "r", "", 11) },
		} {
			if res, err := call(); err != nil || res.Allowed || res.RetryAfter != Never {
				t.Errorf("%s = %+v, %v; want denied, RetryAfter Never", name, res, err)
			}
		}
		if keys := e.countKeys(t); len(keys) != 0 {
			t.Errorf("a weight above a rule wrote %q", keys)
		}
		// Per-resource rules alone take an empty client.
		if res, err := resourceOnly.AllowN(ctx, "r", "", 10); err != nil || !res.Allowed {
			t.Errorf("AllowN(r, \"\", 10) on per-resource rules = %+v, %v", res, err)
		}
	})
}

// An uncontended decision costs 2 round trips under Logs (the lock's, when
// the SCAN fits in a page), one under SortedSet and Windows. A denial this
// Bucket foresaw (it saw the rule full) costs no more: the call only
// looks. One it did not foresee (another Bucket, as another process
// would, took the room) writes, and takes back what it wrote: under
// SortedSet, with a second round trip (ZREM); under Windows, with two
// (the client's hash is read under WATCH, then written). Peek costs one. (The COUNT makes sure the SCAN fits: on
// the real Redis, tests running alongside fill the database with keys of
// their own.)
func TestRoundTrips(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "round trips")
		ctx := context.Background()
		bothRules := []Option{WithScanCount(1 << 20), PerResource(Per(3, time.Minute)), PerClient(Per(1, time.Minute))}
		oneRule := []Option{WithScanCount(1 << 20), WithPrefix(e.prefix + ":one"), PerClient(Per(1, time.Minute))}
		both, bothElsewhere := e.bucket(t, bothRules...), e.bucket(t, bothRules...)
		one, oneElsewhere := e.bucket(t, oneRule...), e.bucket(t, oneRule...)
		for _, b := range []*Bucket{both, one} {
			if _, err := b.Peek(ctx, "r", "z"); err != nil { // the first estimate of Redis's clock
				t.Fatal(err)
			}
		}
		decision, takeBack, singleTakeBack := int64(1), int64(1), int64(1)
		switch e.strategy.(type) {
		case logsStrategy:
			decision, takeBack, singleTakeBack = 2, 0, 0
		case windowsStrategy:
			takeBack, singleTakeBack = 2, 2
		}
		elsewhere := func(b *Bucket, client string) func() {
			return func() {
				if res, err := b.Allow(ctx, "r", client); err != nil || !res.Allowed {
					t.Fatalf("Allow(r, %s) on another Bucket = %+v, %v", client, res, err)
				}
			}
		}
		for _, c := range []struct {
			name    string
			before  func() // not counted
			call    func() (Result, error)
			allowed bool
			want    int64
		}{
			{"Allow, admitted", nil, func() (Result, error) { return both.Allow(ctx, "r", "a") }, true, decision},
			{"Allow, denied by one of two rules, foreseen", nil, func() (Result, error) { return both.Allow(ctx, "r", "a") }, false, decision},
			{"Allow, denied by one of two rules, not foreseen", elsewhere(bothElsewhere, "c"), func() (Result, error) {
				return both.Allow(ctx, "r", "c")
			}, false, decision + takeBack},
			{"Peek", nil, func() (Result, error) { return both.Peek(ctx, "r", "b") }, true, 1},
			{"Allow, one rule, admitted", nil, func() (Result, error) { return one.Allow(ctx, "r", "a") }, true, decision},
			{"Allow, one rule, denied, foreseen", nil, func() (Result, error) { return one.Allow(ctx, "r", "a") }, false, decision},
			{"Allow, one rule, denied, not foreseen", elsewhere(oneElsewhere, "c"), func() (Result, error) {
				return one.Allow(ctx, "r", "c")
			}, false, decision + singleTakeBack},
		} {
			if c.before != nil {
				c.before()
			}
			var err error
			var res Result
			if got := e.trips.count(func() { res, err = c.call() }); got != c.want || err != nil || res.Allowed != c.allowed {
				t.Errorf("%s: %d round trips (result %+v, error %v), want %d", c.name, got, res, err, c.want)
			}
		}
		var err error
		flushTrips := int64(2) // read, then write; Windows: take the client's hash, then its share
		if got := e.trips.count(func() { err = both.Flush(ctx, "r", "a") }); got != flushTrips || err != nil {
			t.Errorf("Flush: %d round trips (error %v), want %d", got, err, flushTrips)
		}
	})
}

// A cancelled context is an error, and records nothing.
func TestCancelledContext(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		b := e.bucket(t, PerClient(Per(1, time.Minute)))
		if _, err := b.Allow(ctx, "r", "a"); !errors.Is(err, context.Canceled) {
			t.Errorf("Allow with a cancelled context: error %v, want context.Canceled", err)
		}
		if _, err := b.Peek(ctx, "r", "a"); !errors.Is(err, context.Canceled) {
			t.Errorf("Peek with a cancelled context: error %v, want context.Canceled", err)
		}
		if keys := e.keys(t); len(keys) != 0 {
			t.Errorf("a cancelled call wrote %q", keys)
		}
	})
}

// Huge limits and weights never wrap around into admitting.
func TestHugeWeightsDoNotOverflow(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		huge := Per(math.MaxInt, time.Minute)
		// SortedSet keeps a member per unit of weight, and Windows adds
		// weights with HINCRBY: New refuses limits they cannot keep.
		if bound, ok := map[string]int{"sortedset": 1000, "windows": maxWindowsRequests}[strategyName(e.strategy)]; ok {
			if _, err := e.new(WithStrategy(e.strategy), PerClient(huge)); !errors.Is(err, ErrInvalidOption) {
				t.Fatalf("New(%v, %v): %v, want ErrInvalidOption", e.strategy, huge, err)
			}
			huge = Per(bound, time.Minute)
		}
		b := e.bucket(t, PerClient(huge))
		half := huge.Requests/2 + 1
		e.run(t, b, "r", []step{
			{0, "a", half, false, want{true, huge.Requests - half, 0, time.Minute, nil}},
			{0, "a", half, false, want{false, huge.Requests - half, time.Minute, time.Minute, []Rule{{PerClient: true, Limit: huge}}}},
			{0, "a", huge.Requests - half, false, want{true, 0, 0, time.Minute, nil}},
			{0, "a", 1, false, want{false, 0, time.Minute, time.Minute, []Rule{{PerClient: true, Limit: huge}}}},
		})
	})
}

// A retry factory that returns nil means: do not retry.
func TestNilRetryStrategy(t *testing.T) {
	eachLocked(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(PerMinute(1)), WithLockWait(0, 0))
		e.admin.Set(context.Background(), remoteOf(b).keysOf("r").ClientLock("a"), "x", time.Minute)
		if _, err := b.Allow(context.Background(), "r", "a"); !errors.Is(err, ErrLockNotObtained) {
			t.Errorf("Allow on a held lock with a nil strategy: error %v, want ErrLockNotObtained", err)
		}
	})
}

// Usage reports what each rule counts now, without a call: what Peek
// reports before its call is counted.
func TestUsage(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		b := e.bucket(t, PerResource(Per(3, time.Minute)), PerClient(Per(2, time.Minute)))
		// used and remaining of each rule, and whether each has a wait
		// and a reset.
		type state struct {
			used, remaining [2]int
			waits, resets   [2]bool
		}
		usage := func() state {
			rules, err := b.Usage(ctx, "r", "a")
			if err != nil || len(rules) != 2 {
				t.Fatalf("Usage = %+v, %v", rules, err)
			}
			var s state
			for i, rr := range rules {
				s.used[i], s.remaining[i], s.waits[i], s.resets[i] = rr.Used, rr.Remaining, rr.RetryAfter > 0, rr.ResetAfter > 0
			}
			return s
		}
		if got, want := usage(), (state{remaining: [2]int{3, 2}}); got != want {
			t.Errorf("Usage before any call = %+v, want %+v", got, want)
		}
		e.run(t, b, "r", []step{{0, "a", 1, false, want{true, 1, 0, time.Minute, nil}}, {0, "a", 1, false, want{true, 0, 0, time.Minute, nil}}})
		want := state{used: [2]int{2, 2}, remaining: [2]int{1, 0}, waits: [2]bool{false, true}, resets: [2]bool{true, true}}
		if got := usage(); got != want {
			t.Errorf("Usage after 2 calls of a = %+v, want %+v", got, want)
		}
		if _, err := b.Usage(ctx, "", "a"); !errors.Is(err, ErrEmptyResource) {
			t.Errorf("Usage with no resource: %v, want ErrEmptyResource", err)
		}
	})
}
