// Package grpclimit limits gRPC calls with a leakybucket.Bucket: server
// interceptors, unary and streaming, that admit each call (each stream,
// once, when it opens) through Bucket.Allow under a resource and a client
// named by a KeyFunc: by default the full method name and the peer's IP
// address.
//
// A denied call fails with codes.ResourceExhausted and a
// google.rpc.RetryInfo detail whose retry_delay is the Result's
// RetryAfter, which clients read with status.FromError and Details. Every
// decided call, admitted or denied, carries the RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10 in its trailer metadata, as
// "ratelimit-policy" and "ratelimit" (the values httplimit writes), and a
// denied one "retry-after" in whole seconds.
//
// When the limiter cannot decide (Redis down or slow, the decision's
// deadline passed), the interceptors fail closed by default
// (codes.Unavailable) or, with WithFailOpen, serve the call and report
// the error to a hook, as httplimit does. WithShadow tries a limit out
// before enforcing it: every call is decided and reported as usual, and
// served, a would-be denial too.
//
// The package is a module of its own, so that the core's users never
// download gRPC.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/httplimit"
	"github.com/leakybucket/leakybucket/inflight"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A KeyFunc names the resource and the client of a call to fullMethod
// ("/package.Service/Method"). An error, or an empty resource, refuses
// the call with codes.InvalidArgument whatever the failure policy: a call
// that cannot be keyed is never served unlimited.
type KeyFunc func(ctx context.Context, fullMethod string) (resource, client string, err error)

// Errors of the interceptors, to match with errors.Is.
var (
	// ErrKey wraps the error of a KeyFunc, or says that it named no
	// resource, or no client for a Bucket with a per-client rule.
	ErrKey = errors.New("grpclimit: no key")

	// ErrNoPeer: the call's context carries no peer address (PeerKey).
	ErrNoPeer = errors.New("grpclimit: no peer address")

	// ErrInvalidOption: an interceptor was given a nil Bucket or KeyFunc,
	// or a negative timeout.
	ErrInvalidOption = errors.New("grpclimit: invalid option")
)

// Trailer metadata keys of the RateLimit fields.
const (
	TrailerPolicy     = "ratelimit-policy"
	TrailerRateLimit  = "ratelimit"
	TrailerRetryAfter = "retry-after"
)

// DefaultDecisionTimeout bounds each call's decision, as httplimit's.
const DefaultDecisionTimeout = httplimit.DefaultDecisionTimeout

// An Option configures an interceptor.
type Option func(*config)

type config struct {
	key          KeyFunc
	failOpen     bool
	report       func(ctx context.Context, fullMethod string, err error)
	timeout      time.Duration
	inFlight     *inflight.Limiter // WithInFlight
	inFlightWait time.Duration
	shadow       bool                  // WithShadow
	refund       func(codes.Code) bool // WithRefund
}

// WithKey sets how a call's resource and client are named (default
// PeerKey).
func WithKey(f KeyFunc) Option {
	return func(c *config) { c.key = f }
}

// WithFailOpen serves calls that the limiter could not decide, and passes
// each such error to report (which may be nil). By default the
// interceptors fail closed: codes.Unavailable. Key errors are refused
// either way.
func WithFailOpen(report func(ctx context.Context, fullMethod string, err error)) Option {
	return func(c *config) { c.failOpen, c.report = true, report }
}

// WithDecisionTimeout bounds each decision (default
// DefaultDecisionTimeout); 0 leaves only the call's own deadline.
func WithDecisionTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithShadow runs the interceptors in shadow mode, to try a limit out
// before enforcing it: every call is decided, counted, reported and given
// its trailer exactly as without the option, and then served, a call
// that would have been denied included. The Bucket's Allow is called as
// it would be, so admitted calls are counted and denied ones are not
// (unless the Bucket counts denials): the shadow run sees the counts that
// the enforcing run would see, and so would deny exactly what the
// enforcing run denies.
//
// A would-be denial keeps its "ratelimit-policy", "ratelimit" and
// "retry-after" trailer; it does not fail with ResourceExhausted. The
// Bucket's observer gets each decision as it would, with
// leakybucket.Decision.Shadow set (otelmetrics labels it
// leakybucket.shadow=true). A call that WithInFlight refuses is served
// likewise, holding no lease and not asked of the Bucket, as refused; its
// wait is kept. Errors are handled as without the option: a call that
// cannot be keyed fails with InvalidArgument, and one the limiter cannot
// decide (Redis unavailable, the decision's deadline) follows the failure
// policy, Unavailable unless WithFailOpen.
func WithShadow() Option {
	return func(c *config) { c.shadow = true }
}

// PeerKey is the default KeyFunc: the full method as the resource, and as
// the client the IP address of the call's peer ("ip:192.0.2.7", without
// the port, so that a client's connections share one count), or, for a
// peer that is not an IP address (a Unix socket), its address as it is.
// Behind a proxy every call has the proxy's address: key by an
// authenticated identity from the metadata there.
func PeerKey(ctx context.Context, fullMethod string) (resource, client string, err error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", "", ErrNoPeer
	}
	if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
		return fullMethod, "ip:" + ap.Addr().Unmap().WithZone("").String(), nil
	}
	return fullMethod, p.Addr.Network() + ":" + p.Addr.String(), nil
}

// UnaryServerInterceptor returns an interceptor that admits each unary
// call through limiter before its handler runs.
func UnaryServerInterceptor(limiter *leakybucket.Bucket, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	l, err := newLimiter(limiter, opts)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		trailer := func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
		end, err := l.admit(ctx, info.FullMethod, trailer)
		if err != nil {
			return nil, err
		}
		defer func() { end(err) }()
		return handler(ctx, req)
	}, nil
}

// StreamServerInterceptor returns an interceptor that admits each stream
// through limiter once, when it opens, before its handler runs: a stream
// is one call, whatever it then sends.
func StreamServerInterceptor(limiter *leakybucket.Bucket, opts ...Option) (grpc.StreamServerInterceptor, error) {
	l, err := newLimiter(limiter, opts)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		end, err := l.admit(ss.Context(), info.FullMethod, ss.SetTrailer)
		if err != nil {
			return err
		}
		defer func() { end(err) }()
		return handler(srv, ss)
	}, nil
}

type limiter struct {
	config
	bucket *leakybucket.Bucket
}

// newLimiter applies and checks opts.
func newLimiter(b *leakybucket.Bucket, opts []Option) (*limiter, error) {
	l := &limiter{config: config{key: PeerKey, timeout: DefaultDecisionTimeout}, bucket: b}
	for _, opt := range opts {
		if opt != nil {
			opt(&l.config)
		}
	}
	switch {
	case b == nil:
		return nil, fmt.Errorf("%w: nil Bucket", ErrInvalidOption)
	case l.key == nil:
		return nil, fmt.Errorf("%w: nil KeyFunc", ErrInvalidOption)
	case l.timeout < 0:
		return nil, fmt.Errorf("%w: negative decision timeout %v", ErrInvalidOption, l.timeout)
	}
	return l, nil
}

// admit decides a call: nil to serve it, with what to call with the
// handler's error when it ends (see admitted, and WithRefund), else the
// status error to end it with.
func (l *limiter) admit(ctx context.Context, method string, trailer func(metadata.MD)) (func(error), error) {
	release, adm, err := l.admitted(ctx, method, trailer)
	if err != nil {
		return nil, err
	}
	return func(err error) {
		release()
		l.giveBack(ctx, method, adm, err)
	}, nil
}

// admitted decides a call: nil to serve it, with what to call when it
// ends (the release of its lease, WithInFlight) and its Admission
// (WithRefund, if admitted), else the status error to end it with.
// trailer sets the call's trailer metadata. A call refused by either
// limit is charged by neither.
func (l *limiter) admitted(ctx context.Context, method string, trailer func(metadata.MD)) (func(), *leakybucket.Admission, error) {
	resource, client, err := l.key(ctx, method)
	if err == nil && resource == "" {
		err = errors.New("empty resource")
	}
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, fmt.Errorf("%w: %w", ErrKey, err).Error())
	}
	release, err := l.hold(ctx, method, resource, client)
	switch {
	case release == nil: // refused for want of room: the Bucket never sees it
		release, err = l.deny(err)
		return release, nil, err
	case err != nil:
		return nil, nil, err
	}
	res, adm, err := l.decide(ctx, resource, client)
	if err != nil {
		if err = l.failed(ctx, method, err); err != nil {
			release()
		}
		return release, nil, err
	}
	trailer(fields(res))
	if !res.Allowed {
		release()
		release, err = l.deny(denied(res))
		return release, nil, err
	}
	return release, adm, nil
}

// deny ends a call that a limit refused with err, or under WithShadow
// serves it, holding no lease.
func (l *limiter) deny(err error) (func(), error) {
	if l.shadow {
		return func() {}, nil
	}
	return nil, err
}

// decide asks the limiter, within the decision's deadline (under
// WithShadow, marked so for its observer): Allow, or WithRefund Admit,
// whose Admission can give the call's weight back.
func (l *limiter) decide(ctx context.Context, resource, client string) (leakybucket.Result, *leakybucket.Admission, error) {
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	if l.shadow {
		ctx = leakybucket.ContextWithShadow(ctx)
	}
	if l.refund != nil {
		adm, res, err := l.bucket.Admit(ctx, resource, client, 1)
		return res, adm, err
	}
	res, err := l.bucket.Allow(ctx, resource, client)
	return res, nil, err
}

// failed handles a limiter error by the failure policy: nil serves the
// call.
func (l *limiter) failed(ctx context.Context, method string, err error) error {
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, leakybucket.ErrEmptyClient):
		return status.Error(codes.InvalidArgument, fmt.Errorf("%w: %w", ErrKey, err).Error())
	case !l.failOpen:
		return status.Error(codes.Unavailable, "grpclimit: the rate limiter cannot decide: "+err.Error())
	case l.report != nil:
		l.report(ctx, method, err)
	}
	return nil
}

// fields returns the RateLimit fields of res as trailer metadata.
func fields(res leakybucket.Result) metadata.MD {
	policy, rateLimit, retry := httplimit.Fields(res)
	md := metadata.Pairs(TrailerPolicy, policy, TrailerRateLimit, rateLimit)
	if retry != "" {
		md.Set(TrailerRetryAfter, retry)
	}
	return md
}

// denied is the status of a denied call: ResourceExhausted with RetryInfo.
func denied(res leakybucket.Result) error {
	return exhausted("rate limited", res.RetryAfter)
}

// exhausted is ResourceExhausted, for why, with RetryInfo of retry.
func exhausted(why string, retry time.Duration) error {
	st := status.New(codes.ResourceExhausted, "grpclimit: "+why+": retry after "+retry.String())
	if detailed, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		st = detailed
	}
	return st.Err()
}
