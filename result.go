package leakybucket

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Result is the answer to Allow, AllowN, Peek and PeekN. All its durations are
// computed from Redis time and the logs Redis holds, exact to the millisecond.
type Result struct {
	// Allowed reports whether every rule had room for the request and it was
	// recorded under all of them (for Peek: whether Allow would admit it).
	Allowed bool

	// Remaining is the least room left over all rules after this call: the
	// weight the same resource and client could still be admitted now.
	Remaining int

	// RetryAfter is 0 when Allowed. Otherwise it is how long until the same
	// call would be admitted, if nothing else is admitted meanwhile.
	RetryAfter time.Duration

	// ResetAfter is how long until every log counted by any rule, this call's
	// included, has expired, so that every rule is back to full room.
	ResetAfter time.Duration

	// DeniedBy lists the rules that had no room for the request, in the order
	// they were given to New. It is empty when Allowed.
	DeniedBy []Rule

	// Rules reports each rule on its own, in the order given to New.
	Rules []RuleResult
}

// RuleResult is the state of one rule after a call.
type RuleResult struct {
	// Rule is the rule reported on.
	Rule Rule

	// Used is the weight the rule counts in its window after the call.
	Used int

	// Remaining is Requests minus Used, or 0 if the limit was lowered below
	// what is already counted.
	Remaining int

	// RetryAfter is how long until this rule alone has room for the call; 0
	// if it has room now.
	RetryAfter time.Duration

	// ResetAfter is how long until every log this rule counts has expired.
	ResetAfter time.Duration
}

// evaluate decides a call of weight n by client (encoded) at Redis time now
// (ms), given the logs found. A request is admitted only if every rule has
// room for it; then it counts under every rule at once.
func evaluate(rules []Rule, logs []logEntry, now int64, client string, n int) Result {
	// Oldest first: the order in which logs leave every window.
	slices.SortFunc(logs, func(a, b logEntry) int { return cmp.Compare(a.at, b.at) })

	res := Result{Allowed: true, Rules: make([]RuleResult, len(rules))}
	for i, rule := range rules {
		rr := &res.Rules[i]
		rr.Rule = rule
		window := rule.Limit.windowMillis()
		var newest int64 = -1
		for _, e := range logs {
			if counts(rule, e, client, now) {
				rr.Used = addCapped(rr.Used, e.weight)
				newest = e.at
			}
		}
		// Compared as room, not as Used+n, which could overflow.
		if rule.Limit.Requests-rr.Used < n {
			res.Allowed = false
			res.DeniedBy = append(res.DeniedBy, rule)
			rr.RetryAfter = millis(untilRoom(rule, logs, client, now, rr.Used, n))
		}
		if newest >= 0 {
			rr.ResetAfter = millis(newest + window - now)
		}
	}
	if res.Allowed {
		// The call's own log is the newest under every rule.
		for i := range res.Rules {
			res.Rules[i].Used += n
			res.Rules[i].ResetAfter = res.Rules[i].Rule.Limit.Window.Truncate(time.Millisecond)
		}
	}
	for i := range res.Rules {
		rr := &res.Rules[i]
		rr.Remaining = max(rr.Rule.Limit.Requests-rr.Used, 0)
		if i == 0 || rr.Remaining < res.Remaining {
			res.Remaining = rr.Remaining
		}
		res.RetryAfter = max(res.RetryAfter, rr.RetryAfter)
		res.ResetAfter = max(res.ResetAfter, rr.ResetAfter)
	}
	return res
}

// counts reports whether rule counts log e at time now.
func counts(rule Rule, e logEntry, client string, now int64) bool {
	if rule.Scope == ScopeClient && e.client != client {
		return false
	}
	return e.at+rule.Limit.windowMillis() > now
}

// untilRoom returns the ms until enough of the counted logs (oldest first)
// have left rule's window for n more to fit. Rooms only grow as time passes,
// so the call fits every rule at the latest of their times.
func untilRoom(rule Rule, logs []logEntry, client string, now int64, used, n int) int64 {
	for _, e := range logs {
		if !counts(rule, e, client, now) {
			continue
		}
		used -= e.weight
		if used <= rule.Limit.Requests-n {
			return e.at + rule.Limit.windowMillis() - now
		}
	}
	return 0 // unreachable while n <= Requests, which AllowN checks
}

// addCapped adds weights, stopping at math.MaxInt instead of wrapping
// around: a count that wrapped would admit. Past the cap RetryAfter errs
// long, which is safe.
func addCapped(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
