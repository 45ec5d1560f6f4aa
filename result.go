package leakybucket

import (
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// Result is the answer to Allow, AllowN, AllowAtMost, Peek and PeekN. All its durations are
// computed from Redis time and the counts Redis holds, exact to the
// millisecond (under Windows, rounded up to the end of an interval); those
// of a Result whose Fallback is true, from this host's clock and the counts
// this process holds.
//
// Every field is exact, but where Windows (or FixedWindows, for a rule with
// a precision) admits a call far from every limit: it may then decide it on
// a bound of a sliding rule's count (the totals of the epochs its window
// reaches, see docs/strategies.md) instead of the count, and admits
// exactly the calls the count would. In such a Result, each such rule's Used
// is never below the exact count and its Remaining never above the exact
// room, and exact wherever the exact Remaining is below a tenth of its
// Requests; Remaining is never above the exact one, and exact wherever the
// exact one is below a tenth of the least Requests of the rules; ResetAfter
// is never before the exact one, and at most one precision after it.
// Allowed, DeniedBy and RetryAfter are always exact, and so is every field
// of a denial, and of Peek and PeekN. Logs, SortedSet, GCRA and NewLocal are
// exact in every field.
type Result struct {
	// Allowed reports whether every rule had room for the request and it was
	// recorded under all of them (for Peek: whether Allow would admit it).
	// With WithRecordDenied, a denied request is recorded too.
	Allowed bool

	// Admitted is the weight AllowAtMost admitted: as much of its n as every
	// rule had room for, the same under every rule, and recorded under
	// each; 0 when it admitted none (Allowed false). It is 0 for Allow,
	// AllowN, Peek and PeekN, which admit all of their weight or nothing.
	Admitted int

	// Remaining is the least room left over all rules after this call: the
	// weight the same resource and client could still be admitted now (or
	// less, under Windows, for a call far from every limit: see Result).
	Remaining int

	// RetryAfter is 0 when Allowed. Otherwise it is how long until the same
	// call would be admitted, if nothing else is admitted meanwhile; or
	// Never, a negative duration, when its weight is more than the
	// Requests of a rule, so that no wait makes room for it.
	RetryAfter time.Duration

	// ResetAfter is how long until every call counted by any rule, this one
	// included, has left its window, so that every rule is back to full room
	// (or up to a precision more, under Windows: see Result).
	ResetAfter time.Duration

	// DeniedBy lists the rules that had no room for the request, in the order
	// they were given to New: those that can never hold it (whose
	// RuleResult.RetryAfter is Never) and those full for now. It is empty
	// when Allowed.
	DeniedBy []Rule

	// Rules reports each rule on its own, in the order given to New.
	Rules []RuleResult

	// Fallback reports that the call was decided in this process by the
	// Bucket's fallback (WithFallback), because the breaker found Redis
	// unreachable, or (WithReplicas) its replicas did not acknowledge the
	// decision on Redis, which was taken back: Rules and DeniedBy then name the rules as the fallback
	// applies them, each Requests divided by the instances WithFallback
	// names, and every other field is the process's own counts; nothing
	// of the call is recorded in Redis. False for a call Redis decided, and
	// under NewLocal.
	Fallback bool
}

// RuleResult is the state of one rule after a call.
type RuleResult struct {
	// Rule is the rule reported on.
	Rule Rule

	// Used is the weight the rule counts in its window after the call (or
	// more, under Windows, for a call far from every limit: see Result);
	// under GCRA, the weight in its bucket, in whole units rounded up.
	Used int

	// Remaining is Requests minus Used, or 0 if the limit was lowered below
	// what is already counted.
	Remaining int

	// RetryAfter is how long until this rule alone has room for the call; 0
	// if it has room now; Never if the call weighs more than its Requests.
	RetryAfter time.Duration

	// ResetAfter is how long until every call this rule counts has left its
	// window (or up to a precision more: see Result).
	ResetAfter time.Duration
}

// Never is the RetryAfter of a call that can never be admitted: one of
// weight n above the Requests of a rule (AllowN(ctx, r, c, 1000) under
// Per(10, time.Second)). It is negative, so that no wait is mistaken for
// it: a caller that sleeps RetryAfter must check for it first (WaitN
// refuses such a call at once, with ErrInvalidWeight). Such a call is a
// denial, not an error, as x/time/rate's AllowN answers false for n above
// its burst: its Result has Allowed false, RetryAfter Never, the rules
// that cannot hold it in DeniedBy with RetryAfter Never in Rules, and every
// other field as for any denied call (Remaining, ResetAfter and each
// rule's Used as they stand, since it counts nowhere). It is recorded
// nowhere, even WithRecordDenied: no wait would ever let it in, and it
// would only fill the rules for a window.
const Never time.Duration = -1

// evaluate decides a call of weight n given v, what each rule counted
// before it. A call is admitted only if every rule has room for it; then,
// or also when denied if recordDenied, it counts under every rule at once,
// stamped at its count's stamp. A call heavier than a rule's Requests
// never counts (see Never).
func (p plan) evaluate(v limits.View, n int, recordDenied bool) Result {
	var res Result
	p.evaluateInto(&res, v, n, recordDenied)
	return res
}

// evaluateInto is evaluate writing into res, in the room of its slices.
func (p plan) evaluateInto(res *Result, v limits.View, n int, recordDenied bool) {
	*res = Result{Allowed: true, Fallback: p.fallback, Rules: roomFor(res.Rules, len(p.Rules)), DeniedBy: res.DeniedBy[:0]}
	for i, rule := range p.Rules {
		if !rule.HasRoom(v.Counts[i].Used, n) {
			res.Allowed = false
			res.DeniedBy = append(res.DeniedBy, p.public[i])
		}
	}
	recorded := (res.Allowed || recordDenied) && n <= p.maxN
	for i, rule := range p.Rules {
		rr := &res.Rules[i]
		rr.Rule = p.public[i]
		rr.fill(rule, v.Counts[i], v, n, recorded, res.Allowed)
		if i == 0 || rr.Remaining < res.Remaining {
			res.Remaining = rr.Remaining
		}
		res.RetryAfter = max(res.RetryAfter, rr.RetryAfter)
		res.ResetAfter = max(res.ResetAfter, rr.ResetAfter)
	}
	if n > p.maxN {
		res.RetryAfter = Never
	}
}

// evaluateCall is evaluateInto for call c, judged at its Weight given v
// (n, but for a call AtMost), which it returns; a call AtMost that was
// admitted says in Admitted how much.
func (p plan) evaluateCall(res *Result, v limits.View, c limits.Call, recordDenied bool) int {
	n := c.Weight(p.Rules, v.Counts)
	p.evaluateInto(res, v, n, recordDenied)
	if c.AtMost && res.Allowed {
		res.Admitted = n
	}
	return n
}

// roomFor returns s with length n, zeroed, in its room if it has enough.
func roomFor(s []RuleResult, n int) []RuleResult {
	if cap(s) < n {
		return make([]RuleResult, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// fill fills rr once the call is decided: counts the call if it was
// recorded, and works out RetryAfter (if it was denied), ResetAfter and
// Remaining.
func (rr *RuleResult) fill(rule limits.Rule, c limits.Count, v limits.View, n int, recorded, allowed bool) {
	if recorded && n > 0 {
		// The call is the newest entry of every rule; RetryAfter, for a
		// call denied and recorded, counts it too.
		if !allowed {
			c.Oldest = append(c.Oldest[:len(c.Oldest):len(c.Oldest)], limits.Entry{At: c.Stamp, Weight: n})
		}
		c.Used = limits.AddCapped(c.Used, n)
		c.Newest = max(c.Newest, c.Stamp)
	}
	rr.Used = c.Used
	switch {
	case allowed:
	case n > rule.Requests:
		rr.RetryAfter = Never
	default:
		rr.RetryAfter = millis(rule.UntilRoom(c.Oldest, v.Now, c.Used, n))
	}
	if c.Used > 0 {
		rr.ResetAfter = millis(max(c.Newest+rule.Window-v.Now, 0))
	}
	rr.Remaining = max(rule.Requests-c.Used, 0)
}

func millis(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }
