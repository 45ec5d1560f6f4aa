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
func WithInFlight(l *inflight.Limiter, wait time.Duration) Option {
	return func(c *config) { c.inFlight, c.inFlightWait = l, wait }
}

// hold takes r's lease, if WithInFlight asks for one, and returns its
// release; or answers r itself (refused, or by the failure policy) and
// returns false.
func (m *middleware) hold(next http.Handler, w http.ResponseWriter, r *http.Request, req call) (func(), bool) {
	if m.inFlight == nil || req.n == 0 {
		return func() {}, true
	}
	le, err := m.acquire(r.Context(), req)
	switch {
	case le != nil:
		return func() { _ = le.Release(context.WithoutCancel(r.Context())) }, true
	case errors.Is(err, inflight.ErrTooHeavy):
		m.denied.ServeHTTP(w, r) // it can never be held: no Retry-After
		return nil, false
	case err != nil && r.Context().Err() == nil:
		m.failed(next, w, r, req, fmt.Errorf("in flight: %w", err))
		return nil, false
	case r.Context().Err() != nil:
		return nil, false // the client went away
	}
	w.Header().Set(headerRetryAfter, strconv.Itoa(1))
	m.denied.ServeHTTP(w, r)
	return nil, false
}

// acquire takes a lease of req's weight, waiting up to the configured
// wait: a nil lease and error when there was no room in time.
func (m *middleware) acquire(ctx context.Context, req call) (*inflight.Lease, error) {
	if m.inFlightWait <= 0 {
		le, _, err := m.inFlight.TryAcquireN(ctx, req.resource, req.key, req.n)
		return le, err
	}
	wctx, cancel := context.WithTimeout(ctx, m.inFlightWait)
	defer cancel()
	le, err := m.inFlight.AcquireN(wctx, req.resource, req.key, req.n)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, nil // the wait ran out: no room in time
	}
	return le, err
}
