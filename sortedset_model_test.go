package leakybucket

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// SortedSet is exact in every field of a Result: its decisions and
// Results must be those of a full log of the calls it admitted, counted
// from when they were made. Random calls of random weights go to three
// Buckets on one miniredis, as three processes, on fake time (so that no
// time passes between a call and its decision, and the log's time is
// Redis's), interleaved with Flush, FlushAll and steps past every window.
// The test keeps its own log of the admitted calls and works out each
// call's Result from it: Allowed, DeniedBy, Remaining, RetryAfter,
// ResetAfter, and each rule's Used, Remaining, RetryAfter and ResetAfter.
// The calls exercise what a decision reads less for: calls sent far from
// every limit (foresight), calls that only look, and calls decided again.
func TestSortedSetDecidesAsAFullLog(t *testing.T) {
	configs := map[string]struct {
		rules []Rule
		most  int // the largest weight
	}{
		"small limits": {[]Rule{{Limit: Per(12, 1500*ms)}, {PerClient: true, Limit: Per(5, 300*ms)}, {PerClient: true, Limit: Per(3, 100*ms)}}, 3},
		"large limits": {[]Rule{{Limit: Per(300, 2*time.Second)}, {PerClient: true, Limit: Per(60, time.Second)}}, 8},
		"per client":   {[]Rule{{PerClient: true, Limit: Per(100, time.Second)}, {PerClient: true, Limit: Per(40, 200*ms)}}, 12},
	}
	base := propertySeed(t)
	for name, c := range configs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			seed := base + uint64(len(name))
			t.Logf("seed %d (LEAKYBUCKET_SEED=%d runs this config again)", seed, base)
			synctest.Test(t, func(t *testing.T) {
				e := newMiniEnv(t, SortedSet)
				opts := make([]Option, len(c.rules))
				for i, r := range c.rules {
					opts[i] = ruleOption(r)
				}
				var procs []*Bucket
				for range 3 {
					rdb := miniClient(e.mini)
					t.Cleanup(func() { rdb.Close() })
					procs = append(procs, e.bucketOn(t, rdb, opts...))
				}
				compareFullLog(t, procs, c.rules, c.most, seed)
			})
		})
	}
}

// fullLog is the test's log of the admitted calls, and the Results that
// an exact sliding log gives.
type fullLog struct {
	rules []Rule
	calls []loggedCall
}

type loggedCall struct {
	at     time.Time
	client string
	n      int
}

// counted returns the calls rule counts for client at now, oldest first.
func (l *fullLog) counted(rule Rule, client string, now time.Time) []loggedCall {
	var out []loggedCall
	for _, c := range l.calls {
		if (!rule.PerClient || c.client == client) && now.Sub(c.at) < rule.Limit.Window {
			out = append(out, c)
		}
	}
	return out
}

// result is the Result of a call of weight n by client at now, and
// records it if admitted.
func (l *fullLog) result(client string, n int, now time.Time) Result {
	res := Result{Allowed: true, Rules: make([]RuleResult, len(l.rules))}
	counts := make([][]loggedCall, len(l.rules))
	for i, rule := range l.rules {
		counts[i] = l.counted(rule, client, now)
		if used(counts[i])+n > rule.Limit.Requests {
			res.Allowed = false
			res.DeniedBy = append(res.DeniedBy, rule)
		}
	}
	if res.Allowed {
		l.calls = append(l.calls, loggedCall{now, client, n})
	}
	res.Remaining = -1
	for i, rule := range l.rules {
		calls := counts[i]
		if res.Allowed {
			calls = append(calls, loggedCall{now, client, n})
		}
		rr := RuleResult{Rule: rule, Used: used(calls), RetryAfter: untilFits(rule, calls, n, now, res.Allowed)}
		rr.Remaining = max(rule.Limit.Requests-rr.Used, 0)
		if len(calls) > 0 {
			rr.ResetAfter = calls[len(calls)-1].at.Add(rule.Limit.Window).Sub(now)
		}
		res.Rules[i] = rr
		if res.Remaining < 0 || rr.Remaining < res.Remaining {
			res.Remaining = rr.Remaining
		}
		res.ResetAfter = max(res.ResetAfter, rr.ResetAfter)
		if !res.Allowed && (rr.RetryAfter == Never || res.RetryAfter != Never && rr.RetryAfter > res.RetryAfter) {
			res.RetryAfter = rr.RetryAfter
		}
	}
	return res
}

func used(calls []loggedCall) int {
	sum := 0
	for _, c := range calls {
		sum += c.n
	}
	return sum
}

// untilFits is how long until a call of weight n fits rule, whose
// counted calls are calls: 0 if it fits now or was admitted, Never if it
// never fits, else until enough of the oldest have left the window.
func untilFits(rule Rule, calls []loggedCall, n int, now time.Time, admitted bool) time.Duration {
	switch {
	case admitted:
		return 0
	case n > rule.Limit.Requests:
		return Never
	}
	left := used(calls)
	for _, c := range calls {
		if left+n <= rule.Limit.Requests {
			break
		}
		left -= c.n
		if left+n <= rule.Limit.Requests {
			return c.at.Add(rule.Limit.Window).Sub(now)
		}
	}
	return 0
}

// flush forgets client's calls, or every call if client is nil.
func (l *fullLog) flush(client *string) {
	l.calls = slices.DeleteFunc(l.calls, func(c loggedCall) bool { return client == nil || c.client == *client })
}

// compareFullLog makes randomCalls to procs, and fails at the first
// whose Result is not the full log's.
func compareFullLog(t *testing.T, procs []*Bucket, rules []Rule, most int, seed uint64) {
	t.Helper()
	log := &fullLog{rules: rules}
	var admitted, denied int
	randomCalls(t, procs, most, seed, log.flush, func(i int, p *Bucket, client string, n int) {
		want := log.result(client, n, time.Now())
		got, err := p.AllowN(context.Background(), "r", client, n)
		if err != nil {
			t.Fatalf("call %d: AllowN(%s, %d): %v", i, client, n, err)
		}
		if diff := resultDiff(got, want); diff != "" {
			t.Fatalf("call %d: AllowN(%s, %d) at %v differs from the full log's: %s\ngot  %+v\nwant %+v", i, client, n, time.Now().Format("15:04:05.000"), diff, got, want)
		}
		if got.Allowed {
			admitted++
		} else {
			denied++
		}
	})
	t.Logf("%d admitted, %d denied", admitted, denied)
	if admitted == 0 || denied == 0 {
		t.Errorf("%d admitted and %d denied: the calls tested too little", admitted, denied)
	}
}

// resultDiff names the first field in which got differs from want.
func resultDiff(got, want Result) string {
	switch {
	case got.Allowed != want.Allowed:
		return "Allowed"
	case !slices.Equal(got.DeniedBy, want.DeniedBy):
		return "DeniedBy"
	case got.Remaining != want.Remaining:
		return "Remaining"
	case got.RetryAfter != want.RetryAfter:
		return "RetryAfter"
	case got.ResetAfter != want.ResetAfter:
		return "ResetAfter"
	case len(got.Rules) != len(want.Rules):
		return "Rules"
	}
	for i := range got.Rules {
		if got.Rules[i] != want.Rules[i] {
			return fmt.Sprintf("rule %d", i)
		}
	}
	return ""
}
