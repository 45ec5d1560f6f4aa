package leakybucket

import "time"

// The denial cache (package denials) holds the Results of calls of weight
// 1 that every rule, all of them per-client, denied: until a rule's oldest
// call leaves its window, the same call gets the same Result, its
// durations moved on. WithRecordDenied turns the cache off, as every
// attempt must count; so does a server clock that was not seen moving at
// this host's pace (a test's, which SetTime moves by jumps).

// cacheable reports how long res stays the answer to its call: until the
// shortest RetryAfter of its rules, if every rule is per-client and denied
// a call of weight 1.
func cacheable(res Result, n int, recordDenied bool) (time.Duration, bool) {
	if n != 1 || recordDenied || res.Allowed || len(res.DeniedBy) != len(res.Rules) {
		return 0, false
	}
	shortest := time.Duration(-1)
	for _, rr := range res.Rules {
		if !rr.Rule.PerClient || rr.RetryAfter <= 0 {
			return 0, false
		}
		if shortest < 0 || rr.RetryAfter < shortest {
			shortest = rr.RetryAfter
		}
	}
	return shortest, true
}

// after returns res as it reads elapsed later, with nothing counted or
// gone meanwhile: its durations shortened by elapsed, rounded up to the
// millisecond (Redis's time is in whole milliseconds: never longer than
// Redis would say).
func (res Result) after(elapsed time.Duration) Result {
	elapsed = max(elapsed+time.Millisecond-1, 0).Truncate(time.Millisecond)
	out := res
	out.Rules = make([]RuleResult, len(res.Rules))
	out.DeniedBy = append([]Rule(nil), res.DeniedBy...)
	out.RetryAfter, out.ResetAfter = max(res.RetryAfter-elapsed, 0), max(res.ResetAfter-elapsed, 0)
	for i, rr := range res.Rules {
		rr.RetryAfter, rr.ResetAfter = max(rr.RetryAfter-elapsed, 0), max(rr.ResetAfter-elapsed, 0)
		out.Rules[i] = rr
	}
	return out
}
