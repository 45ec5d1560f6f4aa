package httplimit

import (
	"fmt"
	"net/http"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/inflight"
)

// DefaultDecisionTimeout bounds each request's decision: a Redis slower
// than this fails the decision with context.DeadlineExceeded, which the
// failure policy handles, rather than holding the request.
const DefaultDecisionTimeout = 500 * time.Millisecond

// DefaultIPv6Prefix is how many leading bits of an IPv6 address name a
// client by default: a /64, what one host or one site usually gets, so
// that a client cannot take 2^64 quotas by changing its address.
const DefaultIPv6Prefix = 64

// An Option configures the middleware made by New or NewTiered.
type Option func(*config)

type config struct {
	key          KeyFunc
	names        []string
	denied       http.Handler
	onError      func(http.ResponseWriter, *http.Request, error)
	failOpen     bool
	report       func(*http.Request, error)
	timeout      time.Duration
	extra        extraFields // WithLegacyHeaders, WithHTTPRateHeaders
	skip         func(*http.Request) bool
	cost         func(*http.Request) int
	ipv6Bits     int
	hideResource bool
	inFlight     *inflight.Limiter // WithInFlight
	inFlightWait time.Duration
	shadow       bool                  // WithShadow
	refund       func(status int) bool // WithRefund
}

// defaultConfig holds every default of the options below.
func defaultConfig() config {
	return config{
		key:      RemoteIP,
		denied:   http.HandlerFunc(tooManyRequests),
		onError:  refuse,
		timeout:  DefaultDecisionTimeout,
		ipv6Bits: DefaultIPv6Prefix,
	}
}

// WithKey sets how a request's client is named (default RemoteIP). See
// XForwardedFor, Forwarded and Header for others.
func WithKey(f KeyFunc) Option {
	return func(c *config) { c.key = f }
}

// WithPolicyNames names the policies of RateLimit-Policy and RateLimit,
// one per rule of the Bucket, in the order of Bucket.Rules (under
// NewTiered, of every tier's Bucket). By default a rule is named by
// DefaultPolicyNames: "per-resource-60s", "per-client-500ms". Names must
// be unique, non-empty, printable ASCII.
func WithPolicyNames(names ...string) Option {
	return func(c *config) { c.names = names }
}

// WithDeniedHandler sets what answers a denied request. It runs after the
// middleware set Retry-After and the RateLimit fields, and must write the
// status, 429 Too Many Requests. The default writes 429 and a text body;
// WithProblemDetails writes problem+json. Use ResultFrom(r.Context()) and
// DeniedPolicies(r.Context()) to say more.
func WithDeniedHandler(h http.Handler) Option {
	return func(c *config) { c.denied = h }
}

// WithProblemDetails answers denied requests with the draft's "quota
// exceeded" problem (RFC 9457, application/problem+json), naming the
// policies that denied in "violated-policies", as ProblemDetails writes
// it. It replaces WithDeniedHandler, and is replaced by a later one.
func WithProblemDetails() Option {
	return func(c *config) { c.denied = http.HandlerFunc(ProblemDetails) }
}

// WithErrorHandler sets what answers a request that the middleware
// refuses for an error: a key error (matching ErrKey), a request it cannot
// weigh or name (ErrCost, ErrNoPattern, ErrTier), or, unless WithFailOpen
// (or the request costs 0),
// a limiter error (ErrUnavailable, context.DeadlineExceeded of the
// decision's deadline, ErrLockNotObtained, a Redis error...). The default
// answers 400 Bad Request to key errors, 500 Internal Server Error to
// ErrCost, ErrNoPattern and ErrTier, and 503 Service Unavailable to the
// others. It is not called for a client that went away before the
// decision.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) { c.onError = h }
}

// WithFailOpen serves requests that the limiter could not decide, and
// passes each such error to report (which may be nil), for example to
// log it or count it. By default the middleware fails closed: the error
// handler answers them, 503 Service Unavailable. Key, cost, pattern and
// tier errors are refused either way. Fail open when availability matters
// more than the limit, closed when the limit guards something that must
// not be overrun.
func WithFailOpen(report func(r *http.Request, err error)) Option {
	return func(c *config) { c.failOpen, c.report = true, report }
}

// WithDecisionTimeout bounds each decision (default
// DefaultDecisionTimeout): Allow runs under context.WithTimeout of the
// request's context. 0 leaves only the request's own context.
func WithDecisionTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithLegacyHeaders also sets the RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset fields of draft-ietf-httpapi-ratelimit-headers-06, for
// the advertised policy closest to its limit: the one that waits longest
// on a denial, else the one with the least remaining. Reset is in
// seconds: on a denial Retry-After, else the policy's t. (Draft -06's own
// RateLimit-Policy is not sent: draft -10 gave that name another form.)
func WithLegacyHeaders() Option {
	return func(c *config) { c.extra.legacy = true }
}

// WithHTTPRateHeaders also sets the fields that go-chi/httprate sends, so
// that a service moving from httprate keeps its clients working:
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, a Unix
// time in seconds, for the advertised policy closest to its limit (as
// WithLegacyHeaders picks it). Reset is when that policy's quota is all
// back, or on a denial with a Retry-After the time it names, rounded up
// to the next whole second. Retry-After, in seconds, is on every denial
// that a wait can end, as without the option.
func WithHTTPRateHeaders() Option {
	return func(c *config) { c.extra.httprate = true }
}

// WithSkip leaves the requests for which skip returns true to the next
// handler untouched: neither counted nor given RateLimit fields, as for a
// health check or an allowlisted client. skip runs before the client is
// keyed.
func WithSkip(skip func(r *http.Request) bool) Option {
	return func(c *config) { c.skip = skip }
}

// WithCost sets the weight of each request (default 1): an export may
// cost 10 where a lookup costs 1, counted with Bucket.AllowN.
//
// A cost above the Requests of a rule can never be admitted: the request
// is denied (429, the denied handler), with the RateLimit fields as they
// stand (r: what remains; t: when the quota of each policy in use is all
// back) and no Retry-After, since no wait lets it pass; DeniedPolicies names the
// policies it is too heavy for (and any full for now), and
// WithProblemDetails says that it costs more than the quota. A cost of 0
// is served uncounted, with the fields as they stand (one read, within
// the decision's deadline; if the read fails, served without fields, the
// error going to WithFailOpen's report, if any), as WithSkip serves
// without them. A negative cost is a bug of the cost function: refused
// whatever the failure policy, with an error matching ErrCost (500 by
// default).
func WithCost(cost func(r *http.Request) int) Option {
	return func(c *config) { c.cost = cost }
}

// WithIPv6Prefix sets how many leading bits of an IPv6 address name a
// client (default DefaultIPv6Prefix, a /64; 128 keys each address apart).
// It applies to the keys of RemoteIP, XForwardedFor and Forwarded, and to
// any key of the form "ip:<IPv6 address>": "ip:2001:db8:1:2::7" becomes
// "ip:2001:db8:1:2::/64". IPv4 addresses are keyed one by one. bits must
// be from 0 to 128.
func WithIPv6Prefix(bits int) Option {
	return func(c *config) { c.ipv6Bits = bits }
}

// WithoutResourcePolicies leaves the per-resource rules out of
// RateLimit-Policy and RateLimit (and of the draft -06 fields), which
// otherwise show every client the capacity and use of the whole resource.
// They still limit, and a denial by one still sets Retry-After.
func WithoutResourcePolicies() Option {
	return func(c *config) { c.hideResource = true }
}

// WithShadow runs the middleware in shadow mode, to try a limit out
// before enforcing it: every request is decided, counted, reported and
// given its fields exactly as without the option, and then served by the
// next handler, a request that would have been denied included. The
// Bucket's AllowN is called as it would be, so admitted requests are
// counted and denied ones are not (unless the Bucket counts denials):
// the shadow run sees the counts that the enforcing run would see, and
// so would deny exactly what the enforcing run denies (a run that counted
// nothing would never deny, and one that counted the denials too would
// deny more).
//
// A would-be denial keeps its RateLimit fields and Retry-After (and the
// fields of WithLegacyHeaders and WithHTTPRateHeaders) on the next
// handler's response; the next handler finds its Result, Allowed false,
// with ResultFrom, and the policies that denied with DeniedPolicies, and
// the denied handler is not called. The Bucket's observer gets each
// decision as it would, with Decision.Shadow set (otelmetrics labels it
// leakybucket.shadow=true). WithInFlight's refusals are served likewise
// (see WithInFlight). Errors are handled as without the option: a
// request that cannot be keyed, weighed or named is refused, and one the
// limiter cannot decide (Redis unavailable, the decision's deadline)
// follows the failure policy, 503 unless WithFailOpen: shadow mode
// serves what a limit denies, not what a failed limiter cannot decide.
func WithShadow() Option {
	return func(c *config) { c.shadow = true }
}

// validate checks the options.
func (c *config) validate() error {
	switch {
	case c.key == nil:
		return fmt.Errorf("%w: nil KeyFunc", ErrInvalidOption)
	case c.denied == nil || c.onError == nil:
		return fmt.Errorf("%w: nil handler", ErrInvalidOption)
	case c.timeout < 0:
		return fmt.Errorf("%w: negative decision timeout %v", ErrInvalidOption, c.timeout)
	case c.ipv6Bits < 0 || c.ipv6Bits > 128:
		return fmt.Errorf("%w: IPv6 prefix /%d, want 0 to 128 bits", ErrInvalidOption, c.ipv6Bits)
	}
	return nil
}

// apply returns the configuration of opts, checked.
func apply(opts []Option) (config, error) {
	c := defaultConfig()
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	return c, c.validate()
}

// policiesOf returns the policies of b's rules under c.
func (c *config) policiesOf(b *leakybucket.Bucket) (policies, error) {
	return newPolicies(b.Rules(), c.names, c.hideResource)
}
