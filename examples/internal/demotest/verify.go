// Package demotest checks the example programs' runs: that every answer
// of the limiter agrees with the calls it admitted before.
package demotest

import (
	"fmt"
	"slices"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

// Verify checks each answer in calls (in the order of At) against the
// calls admitted before it, counted as the rules say: a per-client rule
// counts the caller's calls, a per-resource rule everybody's, and a rule
// with window w at time t counts those made after t-w. It returns what it
// found wrong:
//
//   - an admitted call that some rule had no room for (over-admission);
//   - a denial by a rule that had room, or a rule with no room left out
//     of DeniedBy;
//   - a Used other than the count (the call's weight included if admitted);
//   - a RetryAfter after which the call would still not fit, or before
//     which it would already have.
//
// slack is the strategy's allowed error: 0 for the exact ones, the
// precision for Windows, which may count a call for that much longer, and
// so deny longer, but never admit more.
func Verify(calls []demo.Call, slack time.Duration) []error {
	var errs []error
	for i, c := range calls {
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("call %d (%v, %s, weight %d): %s", i, c.At, c.Client, c.Weight, fmt.Sprintf(format, args...)))
		}
		for _, rr := range c.Result.Rules {
			verifyRule(calls[:i], c, rr, slack, fail)
		}
		verifyAnswer(calls[:i], c, slack, fail)
	}
	return errs
}

// verifyRule checks what rule rr said of call c against the calls before.
func verifyRule(before []demo.Call, c demo.Call, rr leakybucket.RuleResult, slack time.Duration, fail func(string, ...any)) {
	res := c.Result
	least := counted(before, rr.Rule, c.Client, c.At, 0)
	most := counted(before, rr.Rule, c.Client, c.At, slack)
	used := rr.Used
	if res.Allowed {
		used -= c.Weight
	}
	if used < least || used > most {
		fail("%v: used %d before the call, want %d..%d", rr.Rule, used, least, most)
	}
	room := used+c.Weight <= rr.Rule.Limit.Requests
	switch {
	case res.Allowed && !room:
		fail("admitted over %v with %d already counted", rr.Rule, used)
	case !res.Allowed && room == slices.Contains(res.DeniedBy, rr.Rule):
		fail("%v with %d counted: DeniedBy %v", rr.Rule, used, res.DeniedBy)
	}
}

// verifyAnswer checks call c's answer as a whole: an admitted call waits
// for nothing, a denied one is denied by some rule, and fits exactly after
// its RetryAfter.
func verifyAnswer(before []demo.Call, c demo.Call, slack time.Duration, fail func(string, ...any)) {
	res := c.Result
	if res.Allowed {
		if res.RetryAfter != 0 || len(res.DeniedBy) > 0 {
			fail("admitted with RetryAfter %v, DeniedBy %v", res.RetryAfter, res.DeniedBy)
		}
		return
	}
	if len(res.DeniedBy) == 0 {
		fail("denied by no rule")
	}
	// Counted exactly, the call fits after RetryAfter; counted as long as
	// the strategy may, it does not fit 1ms before.
	then := c.At + res.RetryAfter
	if !fits(before, c, then, 0) {
		fail("still no room after RetryAfter %v", res.RetryAfter)
	}
	if res.RetryAfter <= 0 || fits(before, c, then-time.Millisecond, slack) {
		fail("room already before RetryAfter %v", res.RetryAfter)
	}
}

// counted returns the weight rule counts at time at among calls made by
// client, if the rule is per-client: those admitted after at-window-slack.
func counted(calls []demo.Call, rule leakybucket.Rule, client string, at, slack time.Duration) int {
	sum := 0
	for _, c := range calls {
		if c.Result.Allowed && c.At > at-rule.Limit.Window-slack &&
			(!rule.PerClient || c.Client == client) {
			sum += c.Weight
		}
	}
	return sum
}

// fits reports whether every rule of c has room for it at time at.
func fits(calls []demo.Call, c demo.Call, at, slack time.Duration) bool {
	for _, rr := range c.Result.Rules {
		if counted(calls, rr.Rule, c.Client, at, slack)+c.Weight > rr.Rule.Limit.Requests {
			return false
		}
	}
	return true
}
