package grpclimit

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leakybucket/leakybucket"
)

// WithRefund gives an admitted call's weight back when its handler ends
// with a status whose code refund reports true for (ServerFaults:
// Internal, Unavailable, DataLoss, Unknown), so that a call the server
// failed does not keep its client's room: the interceptor admits with
// Bucket.Admit, and once the handler returns, Bucket.Refund gives back
// what the call still holds (see Refund). A handler that returns nil ends
// with OK. The refund runs within the decision timeout, even if the
// client has gone; its error, if any, goes to WithFailOpen's report.
//
// The limiter must be one that can give weight back (the GCRA strategy):
// under another, every call fails with an error matching
// errors.ErrUnsupported, which the failure policy handles.
func WithRefund(refund func(codes.Code) bool) Option {
	return func(c *config) { c.refund = refund }
}

// ServerFaults reports whether code says the server failed the call:
// Internal, Unavailable, DataLoss or Unknown (what a handler's panic or
// an unconverted error ends with). WithRefund's usual choice.
func ServerFaults(code codes.Code) bool {
	switch code {
	case codes.Internal, codes.Unavailable, codes.DataLoss, codes.Unknown:
		return true
	}
	return false
}

// giveBack refunds adm (WithRefund) if the handler's error says so.
func (l *limiter) giveBack(ctx context.Context, method string, adm *leakybucket.Admission, err error) {
	if adm == nil || !l.refund(status.Code(err)) {
		return
	}
	// The client may have gone: the refund is the server's, not its.
	ctx = context.WithoutCancel(ctx)
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	if _, err := l.bucket.Refund(ctx, adm, 1); err != nil && l.report != nil {
		l.report(ctx, method, err)
	}
}
