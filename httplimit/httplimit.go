// Package httplimit limits HTTP requests with a leakybucket.Bucket: a
// middleware, func(http.Handler) http.Handler, that admits each request
// through Bucket.AllowN under a resource named for the route (by default
// the ServeMux pattern that matched it) and a client key taken from the
// request. NewTiered serves clients whose rules depend on who they are,
// from a leakybucket.Tiers.
//
// Every decided response carries the IETF RateLimit header fields in the
// form of draft-ietf-httpapi-ratelimit-headers-10: RateLimit-Policy lists
// one named policy per rule of the Bucket, with its quota (q) and window
// in seconds (w, left out for a window that is not a whole number of
// seconds, which w cannot say), and RateLimit gives each policy's
// remaining quota (r) and t:
//
//	RateLimit-Policy: "per-resource-60s";q=100;w=60, "per-client-10s";q=5;w=10
//	RateLimit: "per-resource-60s";r=97;t=58, "per-client-10s";r=2;t=9
//
// On an admitted request, t is the seconds until the policy's quota is all
// back (in a sliding window some comes back sooner; under the Windows
// strategies a call counts from the end of its interval, so t may exceed w
// by up to the precision). On a denied one, t is given for the policies
// that denied only, the seconds until each has room for the request (at
// most Retry-After); a policy that had room has no t there, since the
// request is not counted and Retry-After, not that policy, says when to
// come back. A request that can never pass has no Retry-After: each
// policy whose quota is in use has its t, as on an admitted request.
// Under leakybucket.GCRA a policy's q is its rule's burst and w the time
// the bucket takes to drain a whole burst (Burst*Window/Requests, left
// out unless whole seconds): Per(10, time.Second).WithBurst(50) is
// q=50;w=5; r is the whole units of burst left, and t the seconds until
// the bucket is empty (on a denial, until the request fits).
// WithoutResourcePolicies leaves the per-resource rules out.
//
// A denied request gets 429 Too Many Requests with Retry-After in whole
// seconds, rounded up (never 0), and a text body, or with
// WithProblemDetails the draft's problem+json. A request whose cost
// (WithCost) is above a policy's quota can never pass: it gets 429 with
// the fields as they stand and no Retry-After. WithLegacyHeaders adds the
// older RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset fields of
// draft -06, which many clients still read, and WithHTTPRateHeaders the
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (a Unix
// time) of go-chi/httprate, for a service that moves from it.
//
// When the limiter cannot decide (Redis down or slow, the decision's
// deadline passed), the middleware fails closed by default (503 Service
// Unavailable) or, with WithFailOpen, serves the request and reports the
// error to a hook.
//
// WithShadow tries a limit out before enforcing it: every request is
// decided, counted and given its fields as usual, its Decision marked
// Shadow for the Bucket's observer, and served, a would-be denial too.
//
// The package uses the standard library only, besides leakybucket (and
// its inflight package, for WithInFlight).
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/leakybucket/leakybucket"
)

// A KeyFunc names the client of a request: the key that the Bucket's
// per-client rules count apart. An error, or an empty key, refuses the
// request (see WithErrorHandler) whatever the failure policy: a request
// that cannot be keyed is never served unlimited.
type KeyFunc func(r *http.Request) (string, error)

// A TierFunc names the tier of a request's client, one that the Tiers of
// NewTiered has rules for: from an authenticated header, a claim of a
// token, a lookup of the API key. Return a default tier for unknown
// clients; an error, or a tier without rules, refuses the request
// whatever the failure policy (ErrTier).
type TierFunc func(r *http.Request) (string, error)

// Errors of the middleware, to match with errors.Is.
var (
	// ErrKey wraps the error of a KeyFunc, or says that it returned an
	// empty key: the error handler gets it, and answers 400 by default.
	ErrKey = errors.New("httplimit: no client key")

	// ErrNoKey: the request carries nothing to key it by (a Header KeyFunc
	// without fallback found no header, or RemoteAddr holds no IP address).
	ErrNoKey = errors.New("httplimit: the request has no key")

	// ErrCost: the WithCost function gave a negative weight, a bug of the
	// server's (a cost of 0 is served uncounted, and one above a quota is
	// denied: see WithCost).
	ErrCost = errors.New("httplimit: invalid request cost")

	// ErrNoPattern: the middleware was made without a resource and the
	// request has no Pattern: wrap the handler given to ServeMux.Handle,
	// not the ServeMux, or name the resource.
	ErrNoPattern = errors.New("httplimit: no resource: the request has no ServeMux pattern")

	// ErrTier wraps the error of a TierFunc, or says that its tier has no
	// rules (leakybucket.ErrUnknownTier) or that WithPolicyNames does not
	// fit the tier's rules.
	ErrTier = errors.New("httplimit: no tier")

	// ErrInvalidOption: New was given a nil Bucket, NewTiered nil Tiers or
	// TierFunc, or either a nil KeyFunc or handler, a negative timeout, an
	// IPv6 prefix outside 0 to 128, or policy names that are not one per
	// rule, unique, and printable ASCII.
	ErrInvalidOption = errors.New("httplimit: invalid option")
)

// New returns a middleware that admits each request through
// limiter.AllowN(ctx, resource, key, cost), where resource names the route
// or handler it wraps (one Bucket may serve many, each with its own
// counts; empty: the request's Pattern, as ServeMux matched it), key is
// the client named by the KeyFunc, and cost is 1 or WithCost's.
//
// An admitted request is served by the next handler with the RateLimit
// fields set; a denied one gets Retry-After (unless it can never pass) and
// the denied handler (WithShadow: the next handler); one that could not be decided is served
// (WithFailOpen) or answered by the error handler (503 by default); one
// skipped (WithSkip) is served as it came; one of cost 0 is served
// uncounted, with the fields as they stand. The next handler and the
// denied handler find the Result with ResultFrom.
func New(limiter *leakybucket.Bucket, resource string, opts ...Option) (func(http.Handler) http.Handler, error) {
	if limiter == nil {
		return nil, fmt.Errorf("%w: nil Bucket", ErrInvalidOption)
	}
	c, err := apply(opts)
	if err != nil {
		return nil, err
	}
	p, err := c.policiesOf(limiter)
	if err != nil {
		return nil, err
	}
	pick := func(*http.Request) (*leakybucket.Bucket, policies, error) { return limiter, p, nil }
	return (&middleware{config: c, resource: resource, pick: pick}).wrap, nil
}

// NewTiered is New for clients whose rules depend on their tier: each
// request is decided by the Bucket of the tier that tierOf names, as
// tiers holds it at that moment, so a Tiers.Set takes effect on the next
// request, and counts follow the client from tier to tier as the Tiers
// type describes. The RateLimit fields advertise the rules of the
// request's tier. WithPolicyNames must fit every tier's rules: it is
// checked here for the tiers already Set, and per request for the others
// (ErrTier).
func NewTiered(tiers *leakybucket.Tiers, tierOf TierFunc, resource string, opts ...Option) (func(http.Handler) http.Handler, error) {
	if tiers == nil || tierOf == nil {
		return nil, fmt.Errorf("%w: nil Tiers or TierFunc", ErrInvalidOption)
	}
	c, err := apply(opts)
	if err != nil {
		return nil, err
	}
	for _, tier := range tiers.Names() {
		if b, ok := tiers.Bucket(tier); ok {
			if _, err := c.policiesOf(b); err != nil {
				return nil, fmt.Errorf("tier %q: %w", tier, err)
			}
		}
	}
	m := &middleware{config: c, resource: resource}
	m.pick = func(r *http.Request) (*leakybucket.Bucket, policies, error) {
		return m.tier(tiers, tierOf, r)
	}
	return m.wrap, nil
}

type middleware struct {
	config
	resource string // "": the request's Pattern
	// pick returns the Bucket that decides r, and its policies.
	pick func(r *http.Request) (*leakybucket.Bucket, policies, error)
}

// wrap is the middleware.
func (m *middleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
}

// tier picks the Bucket of r's tier.
func (m *middleware) tier(tiers *leakybucket.Tiers, tierOf TierFunc, r *http.Request) (*leakybucket.Bucket, policies, error) {
	tier, err := tierOf(r)
	if err != nil {
		return nil, policies{}, fmt.Errorf("%w: %w", ErrTier, err)
	}
	b, ok := tiers.Bucket(tier)
	if !ok {
		return nil, policies{}, fmt.Errorf("%w: %w: %q", ErrTier, leakybucket.ErrUnknownTier, tier)
	}
	p, err := m.policiesOf(b)
	if err != nil {
		return nil, policies{}, fmt.Errorf("%w: tier %q: %w", ErrTier, tier, err)
	}
	return b, p, nil
}

// call is what the middleware decides a request by.
type call struct {
	limiter  *leakybucket.Bucket
	policies policies
	resource string
	key      string
	n        int
}

type resultKey struct{}

// decided is what the middleware puts in the request's context.
type decided struct {
	res    leakybucket.Result
	denied []string // the names of the policies that denied
}

// ResultFrom returns the limiter's Result for the request whose context
// is ctx, as the middleware decided it, and whether there is one: not in a
// request served open after an error, nor one skipped, nor outside the
// middleware. For a request of cost 0 it is what every rule counts, the
// request not counted: Allowed, with each rule's Used, Remaining and
// ResetAfter as they stand. For one whose cost is above a quota its
// RetryAfter is leakybucket.Never.
func ResultFrom(ctx context.Context) (leakybucket.Result, bool) {
	d, ok := ctx.Value(resultKey{}).(decided)
	return d.res, ok
}

// DeniedPolicies returns the names of the policies that denied the request
// whose context is ctx, in the order of the rules, as RateLimit-Policy
// names them (per-resource ones too, when WithoutResourcePolicies leaves
// them out of the fields): what a denied handler reports. It is empty for
// an admitted request and outside the middleware.
func DeniedPolicies(ctx context.Context) []string {
	d, _ := ctx.Value(resultKey{}).(decided)
	return slices.Clone(d.denied)
}

// serve decides the request and answers it.
func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if m.skip != nil && m.skip(r) {
		next.ServeHTTP(w, r)
		return
	}
	req, err := m.prepare(r)
	if err != nil {
		m.onError(w, r, err)
		return
	}
	release, ok := m.hold(next, w, r, req)
	if !ok {
		return
	}
	res, adm, err := m.decide(r.Context(), req)
	switch {
	case err != nil:
		defer release()
		m.failed(next, w, r, req, err)
	case res.Allowed:
		defer release()
		m.serveAdmitted(next, w, m.answered(w, r, req, res), req, adm)
	default:
		release() // at once: a denied request is charged by neither limit
		m.deny(next, w, m.answered(w, r, req, res))
	}
}

// answered sets the fields of res (and Retry-After on a denial that a
// wait can end) and returns r with res in its context, for ResultFrom.
func (m *middleware) answered(w http.ResponseWriter, r *http.Request, req call, res leakybucket.Result) *http.Request {
	req.policies.write(w.Header(), res, m.extra)
	if !res.Allowed && res.RetryAfter != leakybucket.Never {
		w.Header().Set(headerRetryAfter, strconv.FormatInt(retryAfter(res), 10))
	}
	return r.WithContext(context.WithValue(r.Context(), resultKey{}, decided{res, req.policies.denied(res)}))
}

// deny answers a request that a limit denied: the denied handler, or
// under WithShadow the next handler, with the fields as set.
func (m *middleware) deny(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if m.shadow {
		next.ServeHTTP(w, r)
		return
	}
	m.denied.ServeHTTP(w, r)
}

// prepare names, weighs and keys r, and picks its Bucket.
func (m *middleware) prepare(r *http.Request) (call, error) {
	req := call{resource: m.resource, n: 1}
	if req.resource == "" {
		req.resource = r.Pattern
	}
	if req.resource == "" {
		return req, ErrNoPattern
	}
	var err error
	if req.key, err = m.clientKey(r); err != nil {
		return req, err
	}
	if m.cost != nil {
		if req.n = m.cost(r); req.n < 0 {
			return req, fmt.Errorf("%w: %d, want 0 or more", ErrCost, req.n)
		}
	}
	req.limiter, req.policies, err = m.pick(r)
	return req, err
}

// clientKey names r's client, an IPv6 address by its prefix.
func (m *middleware) clientKey(r *http.Request) (string, error) {
	key, err := m.key(r)
	if err == nil && key == "" {
		err = ErrNoKey
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrKey, err)
	}
	return groupIPv6(key, m.ipv6Bits), nil
}

// decide asks the limiter, within the decision's deadline (under
// WithShadow, marked so for its observer): AllowN (WithRefund: Admit,
// whose Admission can give the weight back), or for a request of cost 0,
// which counts nowhere, what every rule counts now (Usage, one read), as
// an admitted Result.
func (m *middleware) decide(ctx context.Context, req call) (leakybucket.Result, *leakybucket.Admission, error) {
	if m.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	if m.shadow {
		ctx = leakybucket.ContextWithShadow(ctx)
	}
	if req.n == 0 {
		rules, err := req.limiter.Usage(ctx, req.resource, req.key)
		return asTheyStand(rules), nil, err
	}
	if m.refund != nil {
		adm, res, err := req.limiter.Admit(ctx, req.resource, req.key, req.n)
		return res, adm, err
	}
	res, err := req.limiter.AllowN(ctx, req.resource, req.key, req.n)
	return res, nil, err
}

// asTheyStand is the Result of a call of weight 0 given what each rule
// counts: admitted, since nothing is asked of any rule, with every rule's
// room and reset as they are.
func asTheyStand(rules []leakybucket.RuleResult) leakybucket.Result {
	res := leakybucket.Result{Allowed: true, Rules: rules}
	for i := range rules {
		rules[i].RetryAfter = 0 // Usage's is for a call of weight 1
		if i == 0 || rules[i].Remaining < res.Remaining {
			res.Remaining = rules[i].Remaining
		}
		res.ResetAfter = max(res.ResetAfter, rules[i].ResetAfter)
	}
	return res
}

// failed handles a limiter error by the failure policy. A client that went
// away is not answered, nor its error reported. A request of cost 0, which
// the limiter only reads for, is served whatever the policy, without
// fields: the error goes to WithFailOpen's report, if any.
func (m *middleware) failed(next http.Handler, w http.ResponseWriter, r *http.Request, req call, err error) {
	switch {
	case r.Context().Err() != nil:
		return
	case !m.failOpen && req.n > 0:
		m.onError(w, r, err)
		return
	case m.report != nil:
		m.report(r, err)
	}
	next.ServeHTTP(w, r)
}

// tooManyRequests is the default denied handler.
func tooManyRequests(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "429 too many requests: "+denial(w, r), http.StatusTooManyRequests)
}

// denial says why a request was denied, and when to come back: after
// Retry-After, or never for a request that costs more than a quota.
func denial(w http.ResponseWriter, r *http.Request) string {
	if res, ok := ResultFrom(r.Context()); ok && res.RetryAfter == leakybucket.Never {
		return "the request costs more than the quota: it can never be served"
	}
	return "retry after " + w.Header().Get(headerRetryAfter) + " s"
}

// refuse is the default error handler.
func refuse(w http.ResponseWriter, _ *http.Request, err error) {
	switch {
	case errors.Is(err, ErrKey):
		http.Error(w, "400 bad request: no client key", http.StatusBadRequest)
	case errors.Is(err, ErrCost) || errors.Is(err, ErrNoPattern) || errors.Is(err, ErrTier):
		http.Error(w, "500 internal server error: the rate limiter cannot weigh, name or place the request", http.StatusInternalServerError)
	default:
		http.Error(w, "503 service unavailable: the rate limiter cannot decide", http.StatusServiceUnavailable)
	}
}
