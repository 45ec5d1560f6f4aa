package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket"
)

// Header field names.
const (
	headerPolicy     = "RateLimit-Policy"
	headerRateLimit  = "RateLimit"
	headerRetryAfter = "Retry-After"
	headerLimit      = "RateLimit-Limit"     // draft -06
	headerRemaining  = "RateLimit-Remaining" // draft -06
	headerReset      = "RateLimit-Reset"     // draft -06
)

// policies are the Bucket's rules as the RateLimit fields name them.
type policies struct {
	names []string // Structured Field strings, quoted: "per-client-10s"
	field string   // the RateLimit-Policy field, the same on every response
}

// newPolicies names each rule (names, or defaults when names is empty)
// and renders RateLimit-Policy.
func newPolicies(rules []leakybucket.Rule, names []string) (policies, error) {
	if len(names) == 0 {
		names = defaultNames(rules)
	}
	if err := checkNames(names, len(rules)); err != nil {
		return policies{}, err
	}
	p := policies{names: make([]string, len(rules))}
	items := make([]string, len(rules))
	for i, rule := range rules {
		p.names[i] = sfString(names[i])
		items[i] = fmt.Sprintf("%s;q=%d;w=%d", p.names[i], rule.Limit.Requests, ceilSeconds(rule.Limit.Window))
	}
	p.field = strings.Join(items, ", ")
	return p, nil
}

// defaultNames names rules by scope and window, "per-client-10s",
// numbering repeats: "per-client-10s-2".
func defaultNames(rules []leakybucket.Rule) []string {
	names := make([]string, len(rules))
	seen := map[string]int{}
	for i, rule := range rules {
		name := rule.Scope.String() + "-" + windowName(rule.Limit.Window)
		seen[name]++
		if n := seen[name]; n > 1 {
			name += "-" + strconv.Itoa(n)
		}
		names[i] = name
	}
	return names
}

// windowName writes a window in whole seconds, "60s", or else in
// milliseconds, "1500ms".
func windowName(w time.Duration) string {
	if w%time.Second == 0 {
		return strconv.FormatInt(int64(w/time.Second), 10) + "s"
	}
	return strconv.FormatInt(w.Milliseconds(), 10) + "ms"
}

// checkNames requires one name per rule, unique, non-empty, and printable
// ASCII, which is what a Structured Field string may hold.
func checkNames(names []string, rules int) error {
	if len(names) != rules {
		return fmt.Errorf("%w: %d policy names for %d rules", ErrInvalidOption, len(names), rules)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if name == "" || seen[name] || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			return fmt.Errorf("%w: policy name %q: want unique, non-empty, printable ASCII", ErrInvalidOption, name)
		}
		seen[name] = true
	}
	return nil
}

// sfString quotes s as a Structured Field string (RFC 9651 §3.3.3).
func sfString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}

// ceilSeconds rounds d up to whole seconds: a client told to wait less
// than it must would come back too early.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// retryAfter is a denial's Retry-After in whole seconds, rounded up and at
// least 1.
func retryAfter(res leakybucket.Result) int64 {
	return max(ceilSeconds(res.RetryAfter), 1)
}

// reset returns the RateLimit field's t for a rule: the seconds until it
// has room again if it denied the call, else until its window has let go
// of every call it counts (all its quota is back by then; in a sliding
// window some comes back sooner); on a denial, never later than
// Retry-After. ok is false when the rule counts nothing, so that no quota
// is to come back.
func reset(rr leakybucket.RuleResult, res leakybucket.Result) (t int64, ok bool) {
	switch {
	case rr.RetryAfter > 0:
		t = ceilSeconds(rr.RetryAfter)
	case rr.ResetAfter > 0:
		t = ceilSeconds(rr.ResetAfter)
	default:
		return 0, false
	}
	if !res.Allowed {
		t = min(t, retryAfter(res))
	}
	return t, true
}

// write sets the RateLimit fields of res on h, and with legacy those of
// draft -06.
func (p policies) write(h http.Header, res leakybucket.Result, legacy bool) {
	items := make([]string, len(res.Rules))
	for i, rr := range res.Rules {
		items[i] = p.names[i] + ";r=" + strconv.Itoa(rr.Remaining)
		if t, ok := reset(rr, res); ok {
			items[i] += ";t=" + strconv.FormatInt(t, 10)
		}
	}
	h.Set(headerPolicy, p.field)
	h.Set(headerRateLimit, strings.Join(items, ", "))
	if legacy {
		writeLegacy(h, res)
	}
}

// writeLegacy sets draft -06's trio for the rule closest to its limit.
func writeLegacy(h http.Header, res leakybucket.Result) {
	rr := closest(res)
	t, _ := reset(rr, res)
	if !res.Allowed {
		t = retryAfter(res) // -06: Reset names the same time as Retry-After
	}
	h.Set(headerLimit, strconv.Itoa(rr.Rule.Limit.Requests))
	h.Set(headerRemaining, strconv.Itoa(rr.Remaining))
	h.Set(headerReset, strconv.FormatInt(t, 10))
}

// closest returns the rule that set RetryAfter on a denial, else the one
// with the least remaining (the first of equals).
func closest(res leakybucket.Result) leakybucket.RuleResult {
	best := res.Rules[0]
	for _, rr := range res.Rules[1:] {
		if res.Allowed && rr.Remaining < best.Remaining || !res.Allowed && rr.RetryAfter > best.RetryAfter {
			best = rr
		}
	}
	return best
}
