package demotest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

// Verify accepts a real limiter's answers, and finds each kind of wrong
// answer planted among them.
func TestVerify(t *testing.T) {
	rdb, sleep := demo.Embedded(miniredis.RunT(t))
	defer rdb.Close()
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerResource(leakybucket.Per(3, 10*time.Second)),
		leakybucket.PerClient(leakybucket.Per(2, 10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	var calls []demo.Call
	for i, client := range []string{"a", "a", "b", "a", "b", "b"} {
		at := time.Duration(i) * time.Second
		if i > 0 {
			sleep(time.Second)
		}
		res, err := limiter.AllowN(context.Background(), "r", client, 1)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, demo.Call{At: at, Client: client, Weight: 1, Result: res})
	}
	// a, a, b allowed; a denied by both rules, b by the resource's, b too.
	if len(calls[3].Result.DeniedBy) != 2 || len(calls[4].Result.DeniedBy) != 1 {
		t.Fatalf("DeniedBy %v and %v, want both rules, then one", calls[3].Result.DeniedBy, calls[4].Result.DeniedBy)
	}
	if errs := Verify(calls, 0); len(errs) > 0 {
		t.Fatalf("a true record: %v", errs)
	}
	if got := demo.MostInWindow(calls, "", 10*time.Second); got != 3 {
		t.Errorf("MostInWindow = %d, want 3", got)
	}
	if got := demo.MostInWindow(calls, "a", time.Second); got != 1 {
		t.Errorf("demo.MostInWindow(a, 1s) = %d, want 1", got)
	}
	plant := map[string]func(*leakybucket.Result){
		"admitted over the limit": func(r *leakybucket.Result) {
			r.Allowed, r.RetryAfter, r.DeniedBy = true, 0, nil
			for i := range r.Rules {
				r.Rules[i].Used++
			}
		},
		"RetryAfter 1ms early":   func(r *leakybucket.Result) { r.RetryAfter -= time.Millisecond },
		"RetryAfter 1ms late":    func(r *leakybucket.Result) { r.RetryAfter += time.Millisecond },
		"a rule left out":        func(r *leakybucket.Result) { r.DeniedBy = r.DeniedBy[:1] },
		"a rule denying wrongly": func(r *leakybucket.Result) { r.DeniedBy = append(r.DeniedBy, r.Rules[1].Rule) },
		"used miscounted":        func(r *leakybucket.Result) { r.Rules[0].Used-- },
	}
	for name, change := range plant {
		bad := slices.Clone(calls)
		i := 3 // a, denied by both rules
		if name == "a rule denying wrongly" {
			i = 4 // b, denied by the resource's rule only
		}
		r := bad[i].Result
		r.DeniedBy = slices.Clone(r.DeniedBy)
		r.Rules = slices.Clone(r.Rules)
		change(&r)
		bad[i].Result = r
		if errs := Verify(bad, 0); len(errs) == 0 {
			t.Errorf("%s: not found", name)
		}
	}
}

func TestClosestToEdge(t *testing.T) {
	rules := []leakybucket.Rule{{PerClient: true, Limit: leakybucket.PerSecond(1)}, {PerClient: true, Limit: leakybucket.PerMinute(1)}}
	calls := []demo.Call{{At: 0}, {At: 1300 * time.Millisecond}, {At: 59900 * time.Millisecond}}
	if d, a, b := closestToEdge(calls, rules); d != 100*time.Millisecond || a != 0 || b != 59900*time.Millisecond {
		t.Errorf("closestToEdge = %v (%v, %v), want 100ms (0s, 59.9s)", d, a, b)
	}
}
