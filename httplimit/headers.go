package httplimit

import (
	"fmt"
	"math"
	"math/big"
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
	headerLimit      = "RateLimit-Limit"       // draft -06
	headerRemaining  = "RateLimit-Remaining"   // draft -06
	headerReset      = "RateLimit-Reset"       // draft -06
	headerXLimit     = "X-RateLimit-Limit"     // go-chi/httprate
	headerXRemaining = "X-RateLimit-Remaining" // go-chi/httprate
	headerXReset     = "X-RateLimit-Reset"     // go-chi/httprate: a Unix time
)

// extraFields are the fields set beside draft -10's.
type extraFields struct {
	legacy   bool // WithLegacyHeaders: draft -06's
	httprate bool // WithHTTPRateHeaders: go-chi/httprate's
}

// policies are the Bucket's rules as the RateLimit fields name them.
type policies struct {
	names  []string           // by rule: "per-client-10s"
	quoted []string           // by rule: names as Structured Field strings
	shown  []int              // the rules advertised, in order
	rules  []leakybucket.Rule // as the Bucket has them
	// field is the RateLimit-Policy field of the Bucket's rules, on every
	// response but those its fallback decided; "" if none is shown.
	field string
}

// newPolicies names each rule (names, or defaults when names is empty),
// picks those to advertise (all, or with hideResource the per-client
// ones) and renders RateLimit-Policy.
func newPolicies(rules []leakybucket.Rule, names []string, hideResource bool) (policies, error) {
	if len(names) == 0 {
		names = DefaultPolicyNames(rules)
	}
	if err := checkNames(names, len(rules)); err != nil {
		return policies{}, err
	}
	p := policies{names: names, quoted: make([]string, len(rules)), rules: rules}
	for i, rule := range rules {
		p.quoted[i] = sfString(names[i])
		if hideResource && !rule.PerClient {
			continue
		}
		p.shown = append(p.shown, i)
	}
	p.field = p.fieldOf(func(i int) leakybucket.Rule { return rules[i] })
	return p, nil
}

// fieldOf renders RateLimit-Policy for the rules shown, rule(i) being
// the i-th rule.
func (p policies) fieldOf(rule func(i int) leakybucket.Rule) string {
	items := make([]string, len(p.shown))
	for j, i := range p.shown {
		l := rule(i).Limit
		items[j] = p.quoted[i] + ";q=" + strconv.Itoa(quota(l)) + window(l)
	}
	return strings.Join(items, ", ")
}

// fieldFor returns RateLimit-Policy for res: the Bucket's, unless res
// counts by other quotas, the shares of its rules that its fallback
// applies while Redis is unreachable (leakybucket.WithFallback).
func (p policies) fieldFor(res leakybucket.Result) string {
	for i, rr := range res.Rules {
		if rr.Rule != p.rules[i] {
			return p.fieldOf(func(i int) leakybucket.Rule { return res.Rules[i].Rule })
		}
	}
	return p.field
}

// quota returns the q of l's policy, the most weight it admits at once:
// under GCRA (a Limit with a Burst) the burst, else Requests (GCRA's
// default burst too).
func quota(l leakybucket.Limit) int {
	if l.Burst != 0 {
		return l.Burst
	}
	return l.Requests
}

// window returns the w parameter of l's policy: the time in which l
// admits its quota, quota(l)*Window/Requests, which is the window, or
// under GCRA the time the bucket takes to drain a whole burst. Whole
// seconds only (the draft has no other unit), else nothing rather than a
// rounded window, which would say the policy admits less, or more, than
// it does.
func window(l leakybucket.Limit) string {
	num := new(big.Int).Mul(big.NewInt(int64(quota(l))), big.NewInt(int64(l.Window)))
	den := new(big.Int).Mul(big.NewInt(int64(l.Requests)), big.NewInt(int64(time.Second)))
	w, rem := num.QuoRem(num, den, new(big.Int))
	if rem.Sign() != 0 || w.Sign() <= 0 || !w.IsInt64() {
		return ""
	}
	return ";w=" + w.String()
}

// denied returns the names of the rules that denied res: those with a
// wait, and those that can never hold the request (RetryAfter Never).
func (p policies) denied(res leakybucket.Result) []string {
	var names []string
	for i, rr := range res.Rules {
		if !res.Allowed && rr.RetryAfter != 0 {
			names = append(names, p.names[i])
		}
	}
	return names
}

// DefaultPolicyNames returns the names that the RateLimit fields give to
// rules, in order, unless WithPolicyNames names them: the rule's scope and
// window, "per-resource-60s", "per-client-500ms", numbered on repeats,
// "per-client-10s-2". A custom denied handler may use them to name
// policies; DeniedPolicies names those that denied a request.
func DefaultPolicyNames(rules []leakybucket.Rule) []string {
	return defaultNames(rules)
}

// defaultNames names rules by scope and window, "per-client-10s",
// numbering repeats: "per-client-10s-2".
func defaultNames(rules []leakybucket.Rule) []string {
	names := make([]string, len(rules))
	seen := map[string]int{}
	for i, rule := range rules {
		name := "per-resource-" + windowName(rule.Limit.Window)
		if rule.PerClient {
			name = "per-client-" + windowName(rule.Limit.Window)
		}
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

// reset returns the RateLimit field's t for a rule of res, and whether it
// has one. For a rule that denied res for now: the seconds until it has
// room for the call (so never later than Retry-After). On a denial with a
// Retry-After, none for a rule that had room, whose own time would say
// nothing of when the request may come back. Else (an admitted call, or
// one that can never be, which has no Retry-After to contradict): the
// seconds until every call the rule counts has left its window, so that
// its quota is all back; none if it counts nothing.
func reset(rr leakybucket.RuleResult, res leakybucket.Result) (t int64, ok bool) {
	switch {
	case !res.Allowed && rr.RetryAfter > 0:
		return ceilSeconds(rr.RetryAfter), true
	case !res.Allowed && res.RetryAfter != leakybucket.Never:
		return 0, false
	}
	return resetAll(rr)
}

// resetAll is the seconds until rr's quota is all back, if it counts
// anything.
func resetAll(rr leakybucket.RuleResult) (t int64, ok bool) {
	return ceilSeconds(rr.ResetAfter), rr.ResetAfter > 0
}

// write sets the RateLimit fields of res on h for the rules shown, and
// the extra ones asked for.
func (p policies) write(h http.Header, res leakybucket.Result, extra extraFields) {
	if len(p.shown) == 0 {
		return
	}
	items := make([]string, len(p.shown))
	for j, i := range p.shown {
		rr := res.Rules[i]
		items[j] = p.quoted[i] + ";r=" + strconv.Itoa(rr.Remaining)
		if t, ok := reset(rr, res); ok {
			items[j] += ";t=" + strconv.FormatInt(t, 10)
		}
	}
	h.Set(headerPolicy, p.fieldFor(res))
	h.Set(headerRateLimit, strings.Join(items, ", "))
	if extra.legacy {
		writeLegacy(h, p.closest(res), res)
	}
	if extra.httprate {
		writeHTTPRate(h, p.closest(res), res, time.Now())
	}
}

// writeLegacy sets draft -06's trio for rr, the rule closest to its limit.
func writeLegacy(h http.Header, rr leakybucket.RuleResult, res leakybucket.Result) {
	t, _ := resetAll(rr)
	if !res.Allowed && res.RetryAfter != leakybucket.Never {
		t = retryAfter(res) // -06: Reset names the same time as Retry-After
	}
	h.Set(headerLimit, strconv.Itoa(quota(rr.Rule.Limit)))
	h.Set(headerRemaining, strconv.Itoa(rr.Remaining))
	h.Set(headerReset, strconv.FormatInt(t, 10))
}

// writeHTTPRate sets go-chi/httprate's fields for rr, the rule closest to
// its limit, as of now: X-RateLimit-Reset is the Unix time, rounded up to
// the next whole second, when rr's quota is all back or, on a denial with
// a Retry-After, when the request may come back; so it is always after
// now, as httprate's end of window is. (httprate's Retry-After, on a
// denial, is the middleware's own.)
func writeHTTPRate(h http.Header, rr leakybucket.RuleResult, res leakybucket.Result, now time.Time) {
	wait := rr.ResetAfter
	if !res.Allowed && res.RetryAfter != leakybucket.Never {
		wait = res.RetryAfter
	}
	h.Set(headerXLimit, strconv.Itoa(quota(rr.Rule.Limit)))
	h.Set(headerXRemaining, strconv.Itoa(rr.Remaining))
	h.Set(headerXReset, strconv.FormatInt(now.Add(wait).Unix()+1, 10))
}

// closest returns, of the rules shown, the one that waits longest on a
// denial (a rule that can never hold the request the longest of all),
// else the one with the least remaining (the first of equals).
func (p policies) closest(res leakybucket.Result) leakybucket.RuleResult {
	best := res.Rules[p.shown[0]]
	for _, i := range p.shown[1:] {
		rr := res.Rules[i]
		if res.Allowed && rr.Remaining < best.Remaining || !res.Allowed && waits(rr) > waits(best) {
			best = rr
		}
	}
	return best
}

// waits orders rules by how long a denied request waits for them: Never
// is longer than any wait.
func waits(rr leakybucket.RuleResult) time.Duration {
	if rr.RetryAfter == leakybucket.Never {
		return math.MaxInt64
	}
	return rr.RetryAfter
}

// Fields returns the values that the middleware gives RateLimit-Policy,
// RateLimit and, on a denial, Retry-After ("" when res is admitted, or
// can never be: RetryAfter leakybucket.Never) for res, with the default policy names (DefaultPolicyNames) and every rule
// shown: for other servers of a Bucket, such as gRPC interceptors, to
// carry the same fields.
func Fields(res leakybucket.Result) (policy, rateLimit, retry string) {
	if len(res.Rules) == 0 {
		return "", "", ""
	}
	rules := make([]leakybucket.Rule, len(res.Rules))
	for i, rr := range res.Rules {
		rules[i] = rr.Rule
	}
	p, _ := newPolicies(rules, nil, false) // default names always fit
	h := http.Header{}
	p.write(h, res, extraFields{})
	if !res.Allowed && res.RetryAfter != leakybucket.Never {
		retry = strconv.FormatInt(retryAfter(res), 10)
	}
	return h.Get(headerPolicy), h.Get(headerRateLimit), retry
}
