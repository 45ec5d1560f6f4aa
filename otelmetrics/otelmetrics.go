// Package otelmetrics records the decisions of a leakybucket.Bucket as
// OpenTelemetry metrics. It is a module of its own, so that users of the
// core package never download OpenTelemetry.
//
//	observe, err := otelmetrics.New(meterProvider)
//	if err != nil { ... }
//	limiter, err := leakybucket.New(rdb, rules..., leakybucket.WithObserver(observe))
//
// OpenTelemetry has no generic rate-limiting conventions; the instruments
// follow the shape of its stable aspnetcore.rate_limiting.* set, under the
// leakybucket namespace:
//
//   - leakybucket.requests, a counter ({request}): one per Allow or AllowN,
//     with leakybucket.request.result, leakybucket.policy when denied, and
//     error.type when it failed;
//   - leakybucket.request.duration, a histogram (s): the latency of every
//     call, Allow, Peek, Flush and FlushAll, with leakybucket.operation and
//     the same attributes.
//
// leakybucket.request.result is, after aspnetcore.rate_limiting.result:
//
//	acquired          the call was admitted
//	resource_limiter  denied, by a per-resource rule among others (as
//	                  aspnetcore's global_limiter: the count all clients share)
//	client_limiter    denied by per-client rules only (as endpoint_limiter)
//	request_canceled  the context ended before a decision (error.type
//	                  deadline)
//	error             any other error: error.type says which
//
// While a Bucket's fallback decides in process (leakybucket.WithFallback),
// its calls carry leakybucket.fallback=true on both instruments, and its
// policies are the shares it applies ("per-client 3 per 1m0s"): the
// switch to the fallback and back shows as the series with the attribute
// starting and stopping. The attribute is absent on the calls Redis
// decides, so that a Bucket without a fallback keeps its series.
//
// The calls of a middleware in shadow mode (httplimit.WithShadow,
// grpclimit.WithShadow), which decides as usual and serves a would-be
// denial anyway, carry leakybucket.shadow=true on both instruments, with
// the result and policy they would have had: the denials a limit being
// tried out would make are the series with leakybucket.shadow=true and a
// result other than acquired. The attribute is absent on every other
// call.
//
// leakybucket.policy names the rules that denied, by Rule.String, joined
// with " + " in the order given to leakybucket.New: "per-client 10 per
// 1m0s", or "per-resource 100 per 30m0s + per-client 10 per 30m0s" when
// both denied. error.type sorts the error with errors.Is, in this order,
// so that a lock or Redis failure joined with the context's error keeps
// its own type:
//
//	invalid_input      leakybucket.ErrEmptyResource, ErrEmptyClient or
//	                   ErrInvalidWeight: nothing was sent to Redis
//	lock_not_obtained  leakybucket.ErrLockNotObtained
//	unavailable        leakybucket.ErrUnavailable
//	deadline           context.DeadlineExceeded or context.Canceled
//	_OTHER             anything else (ErrLockExpired, a Redis error), as
//	                   the semantic conventions ask
//
// Resources and clients are not attributes: they are often user IDs or API
// keys, whose numbers would explode the metrics' cardinality. To tell
// several Buckets apart, give each observer WithAttributes.
package otelmetrics

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/leakybucket/leakybucket"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter: this package's
// import path.
const ScopeName = "github.com/leakybucket/leakybucket/otelmetrics"

// The attributes of the measurements.
const (
	// ResultKey is the result of an Allow: one of the Result values.
	ResultKey = attribute.Key("leakybucket.request.result")
	// PolicyKey names the rules that denied a call.
	PolicyKey = attribute.Key("leakybucket.policy")
	// OperationKey is the method measured, leakybucket.Decision.Op: "allow",
	// "peek", "flush" or "flush_all".
	OperationKey = attribute.Key("leakybucket.operation")
	// ErrorTypeKey is the semantic conventions' error.type.
	ErrorTypeKey = attribute.Key("error.type")
	// FallbackKey is true on the calls that a Bucket's fallback decided
	// in process while Redis was unreachable (leakybucket.WithFallback,
	// Decision.Fallback), and absent on every other.
	FallbackKey = attribute.Key("leakybucket.fallback")
	// ShadowKey is true on the calls made in shadow mode
	// (httplimit.WithShadow, grpclimit.WithShadow,
	// leakybucket.ContextWithShadow: Decision.Shadow), whose denials were
	// not enforced, and absent on every other.
	ShadowKey = attribute.Key("leakybucket.shadow")
)

// The values of ResultKey.
const (
	ResultAcquired        = "acquired"
	ResultResourceLimiter = "resource_limiter"
	ResultClientLimiter   = "client_limiter"
	ResultRequestCanceled = "request_canceled"
	ResultError           = "error"
)

// DurationBuckets are the histogram's bucket boundaries, in seconds, from
// 0.1 ms, since a decision on a nearby Redis takes a fraction of a
// millisecond, to 2.5 s, past the default lock TTL. They are advice: a
// View may replace them.
var DurationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// An Option configures New.
type Option func(*config)

type config struct {
	attrs []attribute.KeyValue
}

// WithAttributes adds attrs to every measurement, such as a name for the
// Bucket observed. Keep their values few: each combination is a series.
func WithAttributes(attrs ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, attrs...) }
}

// New returns an observer for leakybucket.WithObserver that records
// decisions with the instruments of a meter of mp (the global
// MeterProvider if mp is nil). It fails only if an instrument cannot be
// made. The observer is safe for concurrent use and may serve several
// Buckets.
func New(mp metric.MeterProvider, opts ...Option) (func(context.Context, leakybucket.Decision), error) {
	meter, cfg := meterOf(mp, opts)
	requests, err := meter.Int64Counter("leakybucket.requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Number of requests that asked a leakybucket.Bucket for room (Allow, AllowN)."))
	if err != nil {
		return nil, err
	}
	duration, err := meter.Float64Histogram("leakybucket.request.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time a leakybucket.Bucket took to answer a call, from its start to its return."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil {
		return nil, err
	}
	r := &recorder{requests: requests, duration: duration, attrs: cfg.attrs}
	return r.observe, nil
}

// meterOf returns the meter of mp (the global MeterProvider if nil), and
// the options applied.
func meterOf(mp metric.MeterProvider, opts []Option) (metric.Meter, config) {
	var cfg config
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName), cfg
}

type recorder struct {
	requests metric.Int64Counter
	duration metric.Float64Histogram
	attrs    []attribute.KeyValue
}

func (r *recorder) observe(ctx context.Context, d leakybucket.Decision) {
	attrs := attributes(d, r.attrs)
	if d.Op == "allow" {
		r.requests.Add(ctx, 1, metric.WithAttributes(attrs...))
	}
	attrs = append(attrs, OperationKey.String(d.Op))
	r.duration.Record(ctx, seconds(d.Latency), metric.WithAttributes(attrs...))
}

// attributes returns extra and the attributes of d's outcome: the result
// (for an Allow), the denying rules, the error's type.
func attributes(d leakybucket.Decision, extra []attribute.KeyValue) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, len(extra)+6)
	attrs = append(attrs, extra...)
	if d.Op == "allow" {
		attrs = append(attrs, ResultKey.String(result(d)))
	}
	if len(d.DeniedBy) > 0 {
		attrs = append(attrs, PolicyKey.String(policy(d.DeniedBy)))
	}
	if d.Err != nil {
		attrs = append(attrs, ErrorTypeKey.String(errorType(d.Err)))
	}
	if d.Fallback {
		attrs = append(attrs, FallbackKey.Bool(true))
	}
	if d.Shadow {
		attrs = append(attrs, ShadowKey.Bool(true))
	}
	return attrs
}

// result is the value of ResultKey for an Allow.
func result(d leakybucket.Decision) string {
	switch {
	case d.Err != nil && errorType(d.Err) == errorDeadline:
		return ResultRequestCanceled
	case d.Err != nil:
		return ResultError
	case d.Allowed:
		return ResultAcquired
	}
	for _, rule := range d.DeniedBy {
		if !rule.PerClient {
			return ResultResourceLimiter
		}
	}
	return ResultClientLimiter
}

// policy names the rules that denied, as "per-resource 100 per 30m0s +
// per-client 10 per 30m0s".
func policy(rules []leakybucket.Rule) string {
	if len(rules) == 1 {
		return rules[0].String()
	}
	names := make([]string, len(rules))
	for i, rule := range rules {
		names[i] = rule.String()
	}
	return strings.Join(names, " + ")
}

// The values of ErrorTypeKey (see the package doc).
const (
	errorInvalidInput    = "invalid_input"
	errorLockNotObtained = "lock_not_obtained"
	errorUnavailable     = "unavailable"
	errorDeadline        = "deadline"
	errorOther           = "_OTHER"
)

// errorType is the value of error.type for err. The tests run in the order
// of the package doc, so that an ErrLockNotObtained or ErrUnavailable
// joined with the context's error keeps its own type.
func errorType(err error) string {
	switch {
	case errors.Is(err, leakybucket.ErrEmptyResource), errors.Is(err, leakybucket.ErrEmptyClient),
		errors.Is(err, leakybucket.ErrInvalidWeight):
		return errorInvalidInput
	case errors.Is(err, leakybucket.ErrLockNotObtained):
		return errorLockNotObtained
	case errors.Is(err, leakybucket.ErrUnavailable):
		return errorUnavailable
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return errorDeadline
	}
	return errorOther
}

func seconds(d time.Duration) float64 { return d.Seconds() }
