package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/leakybucket/leakybucket/inflight"
)

// WithInFlight holds a lease of l for each request while its handler
// runs, beside the Bucket's rules: at most l's limits of requests run at
// once at the middleware's resource (PerResource) and per client, named
// as the Bucket's key (PerClient). A request waits for room up to wait
// (0: not at all), in order of arrival; one that gets none is refused
// with 429 and a Retry-After of one second (the denied handler answers
// it), and the Bucket never sees it: it is charged by neither. One the
// Bucket denies releases its lease at once. A lease that cannot be had
// because Redis fails follows the failure policy (WithFailOpen).
//
// Under WithShadow, a request refused for want of room (or too heavy to
// hold) is served by the next handler instead, with the Retry-After it
// would have had, holding no lease and not asked of the Bucket, as
// refused: the in-flight counts stay those of the enforcing middleware.
// The wait is kept, so that the decision is the same: give a wait of 0
// to add no latency while trying a limit out.
func WithInFlight(l *inflight.Limiter, wait time.Duration) Option {
	return func(c *config) { c.inFlight, c.inFlightWait = l, wait }
}

// hold takes r's lease, if WithInFlight asks for one, and returns its
// release; or answers r itself (refused, served by WithShadow, or by the
// failure policy) and returns false.
func (m *middleware) hold(next http.Handler, w http.ResponseWriter, r *http.Request, req call) (func(), bool) {
	if m.inFlight == nil || req.n == 0 {
		return func() {}, true
	}
	le, err := m.inFlight.AcquireWithin(r.Context(), req.resource, req.key, req.n, m.inFlightWait)
	switch {
	case le != nil:
		return func() { _ = le.Release(context.WithoutCancel(r.Context())) }, true
	case errors.Is(err, inflight.ErrTooHeavy):
		m.deny(next, w, r) // it can never be held: no Retry-After
		return nil, false
	case err != nil && r.Context().Err() == nil:
		m.failed(next, w, r, req, fmt.Errorf("in flight: %w", err))
		return nil, false
	case r.Context().Err() != nil:
		return nil, false // the client went away
	}
	w.Header().Set(headerRetryAfter, strconv.Itoa(1))
	m.deny(next, w, r)
	return nil, false
}
