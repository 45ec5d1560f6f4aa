package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// fixedWindows is the strategy in which a rule without a precision is a
// fixed window.
var fixedWindows = []Strategy{FixedWindows}

// A rule without a precision under FixedWindows is a fixed window: it counts
// from each multiple of its window and starts again from zero at the next,
// where a sliding window would still count the calls; RetryAfter and
// ResetAfter say when that is. (Every step is at least 100ms from a
// boundary, so that on a real clock the estimate of Redis time, which a
// call counts in, is in the model's window: see FixedWindows.)
func TestFixedWindow(t *testing.T) {
	eachOf(t, fixedWindows, func(t *testing.T, e *env) {
		fixed := Per(3, time.Second)
		b := e.bucket(t, PerClient(fixed))
		deny := []Rule{{PerClient: true, Limit: fixed}}
		e.align(time.Second)
		e.run(t, b, "r", []step{
			{200 * ms, "a", 1, false, want{true, 2, 0, 800 * ms, nil}},
			{0, "a", 1, false, want{true, 1, 0, 800 * ms, nil}},
			{300 * ms, "a", 1, false, want{true, 0, 0, 500 * ms, nil}},
			// t=600: full until the window's end at 1000.
			{100 * ms, "a", 1, false, want{false, 0, 400 * ms, 400 * ms, deny}},
			{0, "a", 1, true, want{false, 0, 400 * ms, 400 * ms, deny}},
			{0, "b", 1, false, want{true, 2, 0, 400 * ms, nil}},
			// t=1100: a new window, empty. A sliding one would count the
			// calls of t=200 until 1200.
			{500 * ms, "a", 1, false, want{true, 2, 0, 900 * ms, nil}},
			{0, "a", 3, false, want{false, 2, 900 * ms, 900 * ms, deny}},
			{0, "a", 2, false, want{true, 0, 0, 900 * ms, nil}},
		})
	})
}

// Each rule counts in its own precision: a call counts as made at the end
// of its interval of each rule, 250ms for the first rule here and the
// strategy's 1s for the second. (Steps at least 100ms past a boundary:
// see TestFixedWindow.)
func TestPerRulePrecision(t *testing.T) {
	eachOf(t, []Strategy{Windows(time.Second)}, func(t *testing.T, e *env) {
		fine, coarse := Per(2, time.Second).WithPrecision(250*ms), Per(3, 2*time.Second)
		b := e.bucket(t, PerClient(fine), PerClient(coarse))
		e.align(time.Second, 250*ms)
		e.run(t, b, "r", []step{
			// t=100: stamped 249 by fine (out at 1249), 999 by coarse (out at 2999).
			{100 * ms, "a", 1, false, want{true, 1, 0, 2899 * ms, nil}},
			{100 * ms, "a", 1, false, want{true, 0, 0, 2799 * ms, nil}},
			// t=350: fine is full until 1249 (exactly: 1100).
			{150 * ms, "a", 1, false, want{false, 0, 899 * ms, 2649 * ms, []Rule{{PerClient: true, Limit: fine}}}},
			// t=1350: fine is empty; the call is coarse's third, stamped 1999.
			{1000 * ms, "a", 1, false, want{true, 0, 0, 2649 * ms, nil}},
			// t=1400: coarse is full until its first two leave at 2999.
			{50 * ms, "a", 1, false, want{false, 0, 1599 * ms, 2599 * ms, []Rule{{PerClient: true, Limit: coarse}}}},
		})
	})
}

// Seed 002's notification sender, at a scale a test can wait for: all
// event types together at most 5 per fixed 3s window, each type at most 2
// per sliding 3s at a precision of 1s.
func TestFixedAndSlidingTogether(t *testing.T) {
	eachOf(t, fixedWindows, func(t *testing.T, e *env) {
		total, each := Per(5, 3*time.Second), Per(2, 3*time.Second).WithPrecision(time.Second)
		b := e.bucket(t, PerResource(total), PerClient(each))
		byTotal, byEach := []Rule{{Limit: total}}, []Rule{{PerClient: true, Limit: each}}
		e.align(3*time.Second, time.Second)
		e.run(t, b, "user", []step{
			// t=100: the total resets at 3000; each type's call leaves at 3999.
			{100 * ms, "a", 1, false, want{true, 1, 0, 3899 * ms, nil}},
			{0, "a", 1, false, want{true, 0, 0, 3899 * ms, nil}},
			{0, "a", 1, false, want{false, 0, 3899 * ms, 3899 * ms, byEach}},
			{0, "b", 1, false, want{true, 1, 0, 3899 * ms, nil}},
			{0, "b", 1, false, want{true, 0, 0, 3899 * ms, nil}},
			{0, "c", 1, false, want{true, 0, 0, 3899 * ms, nil}},
			// t=200: the total is full until its window ends at 3000.
			{100 * ms, "d", 1, false, want{false, 0, 2800 * ms, 2800 * ms, byTotal}},
			// t=3100: a new total window; a's calls still count until 3999.
			{2900 * ms, "d", 1, false, want{true, 1, 0, 3899 * ms, nil}},
			{0, "a", 1, false, want{false, 0, 899 * ms, 2900 * ms, byEach}},
		})
	})
}

// A precision out of range is refused with ErrInvalidOption, whose text
// names the precision and whether it is the Limit's or the strategy's;
// nothing is written. Only Windows takes a precision.
func TestInvalidPrecision(t *testing.T) {
	eachOf(t, append(strategies, FixedWindows), func(t *testing.T, e *env) {
		most := Per(1, maxIntervals*ms).WithPrecision(ms)
		for _, tc := range []struct {
			opts []Option
			says string // whose precision the error's text names
		}{
			{[]Option{PerClient(PerSecond(1).WithPrecision(-ms))}, "invalid option: limit"},
			{[]Option{PerClient(PerSecond(1).WithPrecision(999 * time.Microsecond))}, "invalid option: limit"},
			{[]Option{PerClient(PerSecond(1).WithPrecision(1001 * ms))}, "invalid option: limit"},
			{[]Option{PerClient(Per(1, most.Window+ms).WithPrecision(ms))}, "invalid option: limit"},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(Windows(-ms))}, "invalid option: strategy"},
			{[]Option{PerClient(PerSecond(1).WithPrecision(ms)), WithStrategy(Windows(0))}, "invalid option: strategy"},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(Windows(time.Microsecond))}, "invalid option: strategy"},
			{[]Option{PerClient(PerSecond(1)), WithStrategy(Windows(2 * time.Second))}, "invalid option: strategy"},
			{[]Option{PerClient(Per(1, most.Window+ms)), WithStrategy(Windows(ms))}, "invalid option: strategy"},
		} {
			_, err := e.new(append(tc.opts, WithPrefix(e.prefix))...)
			if !errors.Is(err, ErrInvalidOption) || !strings.Contains(fmt.Sprint(err), tc.says) || !strings.Contains(fmt.Sprint(err), "precision") {
				t.Errorf("New(%v) error = %v, want ErrInvalidOption saying %q and naming the precision", tc.opts, err, tc.says)
			}
		}
		checkPrecisionInRange(t, e, most)
		if keys := e.keys(t); len(keys) != 0 {
			t.Errorf("keys after New only: %q", keys)
		}
	})
}

// checkPrecisionInRange checks that rules with a precision in range, the
// most intervals among them, are taken under Windows whatever the
// strategy's precision, and refused under the other strategies.
func checkPrecisionInRange(t *testing.T, e *env, most Limit) {
	t.Helper()
	_, windows := e.strategy.(windowsStrategy)
	for _, opts := range [][]Option{
		{PerClient(most)},
		{PerClient(PerSecond(1).WithPrecision(time.Second)), PerResource(PerMinute(10))},
	} {
		_, err := e.new(append(opts, WithStrategy(e.strategy), WithPrefix(e.prefix))...)
		switch {
		case windows && err != nil:
			t.Errorf("New with a precision under %v: %v", e.strategy, err)
		case !windows && (!errors.Is(err, ErrInvalidOption) || !strings.Contains(fmt.Sprint(err), "precision")):
			t.Errorf("New with a precision under %v: error %v, want ErrInvalidOption naming the precision", e.strategy, err)
		}
	}
}

// Whatever the calls, no rule admits more than its limit: a fixed rule in
// any of its windows, a sliding one at any precision in any window of its
// length (it is exact or stricter). Random calls of random weights over
// many intervals, on miniredis and in process, with several precisions in
// one Bucket.
func TestPrecisionNeverOverAdmits(t *testing.T) {
	rules := []Rule{
		{Limit: Per(12, 600*ms)},                              // fixed under FixedWindows
		{Limit: Per(25, time.Second).WithPrecision(300 * ms)}, // does not divide the window
		{PerClient: true, Limit: Per(3, 200*ms).WithPrecision(50 * ms)},
		{PerClient: true, Limit: Per(5, 600*ms).WithPrecision(50 * ms)}, // shares its intervals with the rule above
	}
	for _, s := range []Strategy{FixedWindows, Windows(100 * ms)} {
		for _, where := range []string{"miniredis", "local"} {
			t.Run(s.String()+"/"+where, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					opts := []Option{WithStrategy(s)}
					for _, r := range rules {
						opts = append(opts, ruleOption(r))
					}
					e := newLocalEnv(s)
					if where == "miniredis" {
						e = newMiniEnv(t, s)
					}
					b, err := e.new(append(opts, WithPrefix(e.prefix))...)
					if err != nil {
						t.Fatal(err)
					}
					checkNeverOverAdmits(t, b, s, admitRandomCalls(t, b))
				})
			})
		}
	}
}

// ruleOption returns the option that adds r.
func ruleOption(r Rule) Option {
	if r.PerClient {
		return PerClient(r.Limit)
	}
	return PerResource(r.Limit)
}

// admitted is a call a test saw admitted: when (the fake clock, ms), by
// whom, of what weight.
type admitted struct {
	at     int64
	client string
	n      int
}

// admitRandomCalls makes 2000 random calls to b and returns those
// admitted; it fails if a rule of b denied none, which would not test it.
func admitRandomCalls(t *testing.T, b *Bucket) []admitted {
	t.Helper()
	rng := rand.New(rand.NewPCG(3, 5))
	var out []admitted
	denials := map[Rule]int{}
	defer func() {
		for _, rule := range b.Rules() {
			if denials[rule] == 0 {
				t.Errorf("rule %v denied no call", rule)
			}
		}
	}()
	for range 2000 {
		time.Sleep(time.Duration(rng.IntN(25)) * ms)
		client, n := "c"+strconv.Itoa(rng.IntN(3)), 1+rng.IntN(2)
		res, err := b.AllowN(context.Background(), "r", client, n)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			out = append(out, admitted{time.Now().UnixMilli(), client, n})
		}
		for _, rule := range res.DeniedBy {
			denials[rule]++
		}
	}
	return out
}

// checkNeverOverAdmits checks calls against every rule of b under s: the
// weight in each fixed window, or in every sliding window, at most the
// limit.
func checkNeverOverAdmits(t *testing.T, b *Bucket, s Strategy, calls []admitted) {
	t.Helper()
	if len(calls) < 300 {
		t.Fatalf("only %d calls admitted: too few to tell", len(calls))
	}
	for _, rule := range b.Rules() {
		fixed := rule.Limit.Precision == 0 && s.(windowsStrategy).fixed
		for i, c := range calls {
			if used := usedBy(rule, fixed, calls[:i+1], c); used > rule.Limit.Requests {
				t.Fatalf("rule %v: %d admitted in the window of the call of %s at %d", rule, used, c.client, c.at)
			}
		}
	}
}

// usedBy is the weight of calls that rule counts with c, the last of them:
// in the fixed window of c, or in the sliding window that ends with c.
func usedBy(rule Rule, fixed bool, calls []admitted, c admitted) int {
	window, used := rule.Limit.windowMillis(), 0
	for _, d := range calls {
		inWindow := d.at > c.at-window
		if fixed {
			inWindow = d.at/window == c.at/window
		}
		if inWindow && (!rule.PerClient || d.client == c.client) {
			used += d.n
		}
	}
	return used
}
