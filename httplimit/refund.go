package httplimit

import (
	"context"
	"net/http"

	"github.com/leakybucket/leakybucket"
)

// WithRefund gives an admitted request's weight back when the next
// handler answers with a status that refund reports true for
// (ServerErrors: any 5xx), so that a request the server failed does not
// keep its client's room: the middleware admits with Bucket.Admit, and
// once the handler returns, Bucket.Refund gives back what the request
// still holds (see Refund: under GCRA, what has not drained since the
// decision). A handler that writes nothing answers 200. The refund runs
// after the handler, within the decision timeout, even if the client has
// gone; its error, if any, goes to WithFailOpen's report, and the response
// is sent by then whatever it is. A request of cost 0, and one the limiter
// could not decide, has nothing to give back.
//
// The limiter must be one that can give weight back (the GCRA strategy):
// under another, every request fails with an error matching
// errors.ErrUnsupported, which the failure policy handles.
func WithRefund(refund func(status int) bool) Option {
	return func(c *config) { c.refund = refund }
}

// ServerErrors reports whether status is a server error (5xx): WithRefund's
// usual choice, which gives back what a failing server took.
func ServerErrors(status int) bool { return status >= http.StatusInternalServerError }

// serveAdmitted serves an admitted request, and gives its weight back
// (WithRefund) if the handler's status says so.
func (m *middleware) serveAdmitted(next http.Handler, w http.ResponseWriter, r *http.Request, req call, adm *leakybucket.Admission) {
	if adm == nil {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	if !m.refund(sw.answered()) {
		return
	}
	// The client may have gone: the refund is the server's, not its.
	ctx := context.WithoutCancel(r.Context())
	if m.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.timeout)
		defer cancel()
	}
	if _, err := req.limiter.Refund(ctx, adm, req.n); err != nil && m.report != nil {
		m.report(r, err)
	}
}

// statusWriter records the status a handler answers with. Unwrap lets
// http.ResponseController reach the writer's Flush, Hijack and deadlines.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (sw *statusWriter) WriteHeader(status int) {
	if sw.status == 0 && status >= 200 {
		sw.status = status // the first final status; 1xx are informational
	}
	sw.ResponseWriter.WriteHeader(status)
}

func (sw *statusWriter) Write(p []byte) (int, error) {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	return sw.ResponseWriter.Write(p)
}

// Flush flushes the writer if it can, as a handler that streams expects.
func (sw *statusWriter) Flush() {
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	_ = http.NewResponseController(sw.ResponseWriter).Flush()
}

func (sw *statusWriter) Unwrap() http.ResponseWriter { return sw.ResponseWriter }

// answered is the status the handler answered with: 200 if it wrote
// nothing.
func (sw *statusWriter) answered() int {
	if sw.status == 0 {
		return http.StatusOK
	}
	return sw.status
}
