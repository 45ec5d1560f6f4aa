package otelmetrics

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/leakybucket/leakybucket/inflight"
)

// NewInFlight returns an observer for inflight.WithObserver that records
// with a meter of mp (the global MeterProvider if mp is nil):
//
//   - leakybucket.inflight.held: the weight this process holds now, by
//     resource (an up-down counter: acquired adds, released subtracts);
//   - leakybucket.inflight.acquisitions: acquisitions by result
//     ("acquired", "refused": no room, or the wait ran out; "error");
//   - leakybucket.inflight.wait: how long acquired leases waited (s).
//
// Resources become an attribute ("leakybucket.resource"): keep them few.
// It fails only if an instrument cannot be made.
func NewInFlight(mp metric.MeterProvider, opts ...Option) (inflight.Observer, error) {
	meter, cfg := meterOf(mp, opts)
	o := &inFlightRecorder{attrs: cfg.attrs}
	var err error
	if o.held, err = meter.Int64UpDownCounter("leakybucket.inflight.held", metric.WithUnit("{weight}"),
		metric.WithDescription("Weight of the in-flight leases this process holds.")); err != nil {
		return nil, err
	}
	if o.acquisitions, err = meter.Int64Counter("leakybucket.inflight.acquisitions", metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisitions of in-flight leases, by result.")); err != nil {
		return nil, err
	}
	if o.wait, err = meter.Float64Histogram("leakybucket.inflight.wait", metric.WithUnit("s"),
		metric.WithDescription("Time an acquired in-flight lease waited for room."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...)); err != nil {
		return nil, err
	}
	return o, nil
}

type inFlightRecorder struct {
	held         metric.Int64UpDownCounter
	acquisitions metric.Int64Counter
	wait         metric.Float64Histogram
	attrs        []attribute.KeyValue
}

func (o *inFlightRecorder) set(resource string, more ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(append([]attribute.KeyValue{attribute.String("leakybucket.resource", resource)}, o.attrs...), more...)...)
}

func (o *inFlightRecorder) Acquired(resource string, n int, waited time.Duration) {
	ctx := context.Background()
	o.held.Add(ctx, int64(n), o.set(resource))
	o.acquisitions.Add(ctx, 1, o.set(resource, attribute.String("leakybucket.result", "acquired")))
	o.wait.Record(ctx, waited.Seconds(), o.set(resource))
}

func (o *inFlightRecorder) Refused(resource string, _ int, err error) {
	result := "refused"
	if err != nil && !errorIsDeadline(err) {
		result = "error"
	}
	o.acquisitions.Add(context.Background(), 1, o.set(resource, attribute.String("leakybucket.result", result)))
}

func (o *inFlightRecorder) Released(resource string, n int, _ error) {
	o.held.Add(context.Background(), -int64(n), o.set(resource))
}

// errorIsDeadline: an acquisition whose wait ran out was refused, not an
// error.
func errorIsDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
