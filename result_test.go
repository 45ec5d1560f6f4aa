package leakybucket

import (
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// evaluate on its own: what each store reads (a view) against the Result
// it must give, without Redis.
func TestEvaluate(t *testing.T) {
	perClient := Rule{PerClient: true, Limit: Per(3, time.Second)}
	perResource := Rule{Limit: Per(5, time.Minute)}
	// Entries stamped at 100, 200 and 900 ms; now is 1000 ms.
	three := limits.Count{Used: 3, Oldest: []limits.Entry{{At: 100, Weight: 1}, {At: 200, Weight: 1}, {At: 900, Weight: 1}}, Newest: 900}
	for _, c := range []struct {
		name         string
		rules        []Rule
		counts       []limits.Count
		n            int
		recordDenied bool
		want         Result
	}{
		{
			name: "empty: admitted, counted from the stamp", rules: []Rule{perClient}, counts: []limits.Count{{}}, n: 1,
			want: Result{Allowed: true, Remaining: 2, ResetAfter: time.Second,
				Rules: []RuleResult{{Rule: perClient, Used: 1, Remaining: 2, ResetAfter: time.Second}}},
		},
		{
			name: "full: denied until the oldest leaves", rules: []Rule{perClient}, counts: []limits.Count{three}, n: 1,
			want: Result{RetryAfter: 100 * time.Millisecond, ResetAfter: 900 * time.Millisecond, DeniedBy: []Rule{perClient},
				Rules: []RuleResult{{Rule: perClient, Used: 3, RetryAfter: 100 * time.Millisecond, ResetAfter: 900 * time.Millisecond}}},
		},
		{
			name: "weight 2 waits for the two oldest", rules: []Rule{perClient}, counts: []limits.Count{three}, n: 2,
			want: Result{RetryAfter: 200 * time.Millisecond, ResetAfter: 900 * time.Millisecond, DeniedBy: []Rule{perClient},
				Rules: []RuleResult{{Rule: perClient, Used: 3, RetryAfter: 200 * time.Millisecond, ResetAfter: 900 * time.Millisecond}}},
		},
		{
			name: "all or nothing: one rule full denies, the other is not charged", rules: []Rule{perResource, perClient},
			counts: []limits.Count{{Used: 1, Oldest: []limits.Entry{{At: 500, Weight: 1}}, Newest: 500}, three}, n: 1,
			want: Result{Remaining: 0, RetryAfter: 100 * time.Millisecond, ResetAfter: 59500 * time.Millisecond, DeniedBy: []Rule{perClient},
				Rules: []RuleResult{
					{Rule: perResource, Used: 1, Remaining: 4, ResetAfter: 59500 * time.Millisecond},
					{Rule: perClient, Used: 3, RetryAfter: 100 * time.Millisecond, ResetAfter: 900 * time.Millisecond},
				}},
		},
		{
			name: "recorded when denied: counted, and waits for itself", rules: []Rule{perClient}, counts: []limits.Count{three}, n: 1, recordDenied: true,
			want: Result{RetryAfter: 200 * time.Millisecond, ResetAfter: time.Second, DeniedBy: []Rule{perClient},
				Rules: []RuleResult{{Rule: perClient, Used: 4, RetryAfter: 200 * time.Millisecond, ResetAfter: time.Second}}},
		},
		{
			name: "no call (Usage): counts as they are", rules: []Rule{perClient}, counts: []limits.Count{three}, n: 0,
			want: Result{Allowed: true, ResetAfter: 900 * time.Millisecond,
				Rules: []RuleResult{{Rule: perClient, Used: 3, ResetAfter: 900 * time.Millisecond}}},
		},
		{
			name: "huge weights do not wrap", rules: []Rule{{PerClient: true, Limit: Per(math.MaxInt, time.Second)}},
			counts: []limits.Count{{Used: math.MaxInt - 1, Oldest: []limits.Entry{{At: 900, Weight: math.MaxInt - 1}}, Newest: 900}}, n: 2,
			want: Result{Remaining: 1, RetryAfter: 900 * time.Millisecond, ResetAfter: 900 * time.Millisecond, DeniedBy: []Rule{{PerClient: true, Limit: Per(math.MaxInt, time.Second)}},
				Rules: []RuleResult{{Rule: Rule{PerClient: true, Limit: Per(math.MaxInt, time.Second)}, Used: math.MaxInt - 1, Remaining: 1, RetryAfter: 900 * time.Millisecond, ResetAfter: 900 * time.Millisecond}}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			counts := slices.Clone(c.counts)
			for i := range counts {
				counts[i].Stamp = 1000
			}
			got := newPlan(config{rules: c.rules}).evaluate(limits.View{Now: 1000, Counts: counts}, c.n, c.recordDenied)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("evaluate =\n%+v\nwant\n%+v", got, c.want)
			}
		})
	}
}
