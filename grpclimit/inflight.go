package grpclimit

import (
	"context"
	"time"

	"github.com/leakybucket/leakybucket/inflight"
)

// WithInFlight holds a lease of l for each call while its handler runs
// (a stream: while it is open), beside the Bucket's rules: at most l's
// limits of calls at once per resource and client, as the KeyFunc names
// them. A call waits for room up to wait (0: not at all), in order of
// arrival; one that gets none fails with ResourceExhausted and a
// RetryInfo of one second, and the Bucket never sees it. One the Bucket
// denies releases its lease at once. A lease that cannot be had because
// Redis fails follows the failure policy (WithFailOpen).
func WithInFlight(l *inflight.Limiter, wait time.Duration) Option {
	return func(c *config) { c.inFlight, c.inFlightWait = l, wait }
}

// noRoomRetry is the RetryInfo of a call refused for want of room: when a
// slot frees is not known.
const noRoomRetry = time.Second

// hold takes the call's lease, if WithInFlight asks for one, and returns
// its release; a nil release, with the status to end the call with, when
// it is refused for want of room.
func (l *limiter) hold(ctx context.Context, method, resource, client string) (func(), error) {
	if l.inFlight == nil {
		return func() {}, nil
	}
	le, err := l.inFlight.AcquireWithin(ctx, resource, client, 1, l.inFlightWait)
	switch {
	case le != nil:
		return func() { _ = le.Release(context.WithoutCancel(ctx)) }, nil
	case err != nil:
		return func() {}, l.failed(ctx, method, err)
	}
	return nil, exhausted("too many in flight", noRoomRetry)
}
