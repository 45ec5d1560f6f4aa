package otelmetrics

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leakybucket/leakybucket/inflight"
)

// TestInFlight: held follows acquisitions and releases (a second release
// subtracts nothing), and acquisitions count by result.
func TestInFlight(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	o, err := NewInFlight(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := inflight.NewLocal(inflight.PerResource(3), inflight.WithObserver(o))
	ctx := context.Background()
	a, _, _ := l.TryAcquireN(ctx, "r", "c", 2)
	_, _, _ = l.TryAcquireN(ctx, "r", "c", 2) // refused
	b, _, _ := l.TryAcquire(ctx, "r", "c")
	_ = a.Release(ctx)
	_ = a.Release(ctx)
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if s, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range s.DataPoints {
					key := m.Name
					if r, ok := p.Attributes.Value("leakybucket.result"); ok {
						key += "/" + r.AsString()
					}
					got[key] += p.Value
				}
			}
		}
	}
	want := map[string]int64{"leakybucket.inflight.held": 1, "leakybucket.inflight.acquisitions/acquired": 2, "leakybucket.inflight.acquisitions/refused": 1}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	_ = b.Release(ctx)
}
