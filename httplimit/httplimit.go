// Package httplimit limits HTTP requests with a leakybucket.Bucket: a
// middleware, func(http.Handler) http.Handler, that admits each request
// through Bucket.Allow under a resource named for the route and a client
// key taken from the request.
//
// Every decided response carries the IETF RateLimit header fields in the
// form of draft-ietf-httpapi-ratelimit-headers-10: RateLimit-Policy lists
// one named policy per rule of the Bucket, with its quota (q) and window
// in whole seconds (w), and RateLimit gives each policy's remaining quota
// (r) and the seconds until more quota comes (t):
//
//	RateLimit-Policy: "per-resource-60s";q=100;w=60, "per-client-10s";q=5;w=10
//	RateLimit: "per-resource-60s";r=97;t=58, "per-client-10s";r=2;t=9
//
// A denied request gets 429 Too Many Requests with Retry-After in whole
// seconds, rounded up (never 0). WithLegacyHeaders adds the older
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset fields of draft
// -06, which many clients still read.
//
// When the limiter cannot decide (Redis down or slow, the decision's
// deadline passed), the middleware fails closed by default (503 Service
// Unavailable) or, with WithFailOpen, serves the request and reports the
// error to a hook.
//
// The package uses the standard library only, besides leakybucket.
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/leakybucket/leakybucket"
)

// A KeyFunc names the client of a request: the key that the Bucket's
// per-client rules count apart. An error, or an empty key, refuses the
// request (see WithErrorHandler) whatever the failure policy: a request
// that cannot be keyed is never served unlimited.
type KeyFunc func(r *http.Request) (string, error)

// Errors of the middleware, to match with errors.Is.
var (
	// ErrKey wraps the error of a KeyFunc, or says that it returned an
	// empty key: the error handler gets it, and answers 400 by default.
	ErrKey = errors.New("httplimit: no client key")

	// ErrNoKey: the request carries nothing to key it by (a Header KeyFunc
	// without fallback found no header, or RemoteAddr holds no IP address).
	ErrNoKey = errors.New("httplimit: the request has no key")

	// ErrInvalidOption: New was given a nil Bucket, an empty resource, a
	// nil KeyFunc or handler, a negative timeout, or policy names that are
	// not one per rule, unique, and printable ASCII.
	ErrInvalidOption = errors.New("httplimit: invalid option")
)

// DefaultDecisionTimeout bounds each request's decision: a Redis slower
// than this fails the decision with context.DeadlineExceeded, which the
// failure policy handles, rather than holding the request.
const DefaultDecisionTimeout = 500 * time.Millisecond

// An Option configures the middleware made by New.
type Option func(*config)

type config struct {
	key      KeyFunc
	names    []string
	denied   http.Handler
	onError  func(http.ResponseWriter, *http.Request, error)
	failOpen bool
	report   func(*http.Request, error)
	timeout  time.Duration
	legacy   bool
}

// WithKey sets how a request's client is named (default RemoteIP). See
// XForwardedFor, Forwarded and Header for others.
func WithKey(f KeyFunc) Option {
	return func(c *config) { c.key = f }
}

// WithPolicyNames names the policies of RateLimit-Policy and RateLimit,
// one per rule of the Bucket, in the order of Bucket.Rules. By default a
// rule is named by its scope and window: "per-resource-60s",
// "per-client-500ms" (with "-2", "-3"... on repeats). Names must be
// unique, non-empty, printable ASCII.
func WithPolicyNames(names ...string) Option {
	return func(c *config) { c.names = names }
}

// WithDeniedHandler sets what answers a denied request. It runs after the
// middleware set Retry-After and the RateLimit fields, and must write the
// status, 429 Too Many Requests. The default writes 429 and a text body;
// use ResultFrom(r.Context()) to say more, for example which rules denied.
func WithDeniedHandler(h http.Handler) Option {
	return func(c *config) { c.denied = h }
}

// WithErrorHandler sets what answers a request that the middleware
// refuses for an error: a key error (matching ErrKey), or, unless
// WithFailOpen, a limiter error (ErrUnavailable, context.DeadlineExceeded
// of the decision's deadline, ErrLockNotObtained, a Redis error...). The
// default answers 400 Bad Request to key errors and 503 Service
// Unavailable to the others. It is not called for a client that went
// away before the decision.
func WithErrorHandler(h func(w http.ResponseWriter, r *http.Request, err error)) Option {
	return func(c *config) { c.onError = h }
}

// WithFailOpen serves requests that the limiter could not decide, and
// passes each such error to report (which may be nil), for example to
// log it or count it. By default the middleware fails closed: the error
// handler answers them, 503 Service Unavailable. Key errors are refused
// either way. Fail open when availability matters more than the limit,
// closed when the limit guards something that must not be overrun.
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
// the policy closest to its limit: the one that set Retry-After on a
// denial, else the one with the least remaining. Reset is in seconds, as
// the RateLimit field's t. (Draft -06's own RateLimit-Policy is not sent:
// draft -10 gave that name another form.)
func WithLegacyHeaders() Option {
	return func(c *config) { c.legacy = true }
}

// New returns a middleware that admits each request through
// limiter.Allow(ctx, resource, key), where resource names the route or
// handler it wraps (one Bucket may serve many, each with its own counts)
// and key is the client named by the KeyFunc.
//
// An admitted request is served by the next handler with the RateLimit
// fields set; a denied one gets Retry-After and the denied handler; one
// that could not be decided is served (WithFailOpen) or answered by the
// error handler (503 by default). The next handler and the denied handler
// find the Result with ResultFrom.
func New(limiter *leakybucket.Bucket, resource string, opts ...Option) (func(http.Handler) http.Handler, error) {
	c := config{key: RemoteIP, denied: http.HandlerFunc(tooManyRequests), onError: refuse, timeout: DefaultDecisionTimeout}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if err := c.validate(limiter, resource); err != nil {
		return nil, err
	}
	p, err := newPolicies(limiter.Rules(), c.names)
	if err != nil {
		return nil, err
	}
	m := &middleware{config: c, limiter: limiter, resource: resource, policies: p}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(next, w, r) })
	}, nil
}

func (c *config) validate(limiter *leakybucket.Bucket, resource string) error {
	switch {
	case limiter == nil:
		return fmt.Errorf("%w: nil Bucket", ErrInvalidOption)
	case resource == "":
		return fmt.Errorf("%w: empty resource", ErrInvalidOption)
	case c.key == nil:
		return fmt.Errorf("%w: nil KeyFunc", ErrInvalidOption)
	case c.denied == nil || c.onError == nil:
		return fmt.Errorf("%w: nil handler", ErrInvalidOption)
	case c.timeout < 0:
		return fmt.Errorf("%w: negative decision timeout %v", ErrInvalidOption, c.timeout)
	}
	return nil
}

type middleware struct {
	config
	limiter  *leakybucket.Bucket
	resource string
	policies policies
}

type resultKey struct{}

// ResultFrom returns the limiter's Result for the request whose context
// is ctx, as the middleware decided it, and whether there is one: not in a
// request served open after an error, nor outside the middleware.
func ResultFrom(ctx context.Context) (leakybucket.Result, bool) {
	res, ok := ctx.Value(resultKey{}).(leakybucket.Result)
	return res, ok
}

// serve decides the request and answers it.
func (m *middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	key, err := m.key(r)
	if err == nil && key == "" {
		err = ErrNoKey
	}
	if err != nil {
		m.onError(w, r, fmt.Errorf("%w: %w", ErrKey, err))
		return
	}
	res, err := m.decide(r.Context(), key)
	if err != nil {
		m.failed(next, w, r, err)
		return
	}
	m.policies.write(w.Header(), res, m.legacy)
	r = r.WithContext(context.WithValue(r.Context(), resultKey{}, res))
	if !res.Allowed {
		w.Header().Set(headerRetryAfter, strconv.FormatInt(retryAfter(res), 10))
		m.denied.ServeHTTP(w, r)
		return
	}
	next.ServeHTTP(w, r)
}

// decide asks the limiter, within the decision's deadline.
func (m *middleware) decide(ctx context.Context, key string) (leakybucket.Result, error) {
	if m.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	return m.limiter.Allow(ctx, m.resource, key)
}

// failed handles a limiter error by the failure policy. A client that went
// away is not answered, nor its error reported.
func (m *middleware) failed(next http.Handler, w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case r.Context().Err() != nil:
		return
	case !m.failOpen:
		m.onError(w, r, err)
		return
	case m.report != nil:
		m.report(r, err)
	}
	next.ServeHTTP(w, r)
}

// tooManyRequests is the default denied handler.
func tooManyRequests(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, "429 too many requests: retry after "+w.Header().Get(headerRetryAfter)+" s", http.StatusTooManyRequests)
}

// refuse is the default error handler.
func refuse(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrKey) {
		http.Error(w, "400 bad request: no client key", http.StatusBadRequest)
		return
	}
	http.Error(w, "503 service unavailable: the rate limiter cannot decide", http.StatusServiceUnavailable)
}
