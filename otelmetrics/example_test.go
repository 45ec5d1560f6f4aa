package otelmetrics_test

import (
	"context"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/otelmetrics"
	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Record a Bucket's decisions on a MeterProvider; here one read by hand,
// in production one with an exporter.
func ExampleNew() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe, err := otelmetrics.New(mp)
	if err != nil {
		log.Fatal(err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerClient(leakybucket.PerMinute(2)),
		leakybucket.WithObserver(observe))
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, err := limiter.Allow(context.Background(), "GET /search", "api-key-42"); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				result, _ := p.Attributes.Value(otelmetrics.ResultKey)
				policy, _ := p.Attributes.Value(otelmetrics.PolicyKey)
				fmt.Printf("%s %s=%s %q: %d\n", m.Name, otelmetrics.ResultKey, result.AsString(), policy.AsString(), p.Value)
			}
		}
	}
	// Unordered output:
	// leakybucket.requests leakybucket.request.result=acquired "": 2
	// leakybucket.requests leakybucket.request.result=client_limiter "per-client 2 per 1m0s": 1
}

// A limit tried out in shadow mode: httplimit.WithShadow and
// grpclimit.WithShadow decide with a context of
// leakybucket.ContextWithShadow, and the decisions they would have
// enforced are the series with leakybucket.shadow=true.
func ExampleNew_shadow() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	observe, err := otelmetrics.New(mp)
	if err != nil {
		log.Fatal(err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerClient(leakybucket.PerMinute(2)),
		leakybucket.WithObserver(observe))
	if err != nil {
		log.Fatal(err)
	}
	shadow := leakybucket.ContextWithShadow(context.Background()) // what WithShadow does
	for range 3 {
		if _, err := limiter.Allow(shadow, "GET /search", "api-key-42"); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				result, _ := p.Attributes.Value(otelmetrics.ResultKey)
				shadowed, _ := p.Attributes.Value(otelmetrics.ShadowKey)
				fmt.Printf("%s %s=%s %s=%t: %d\n", m.Name, otelmetrics.ResultKey, result.AsString(), otelmetrics.ShadowKey, shadowed.AsBool(), p.Value)
			}
		}
	}
	// Unordered output:
	// leakybucket.requests leakybucket.request.result=acquired leakybucket.shadow=true: 2
	// leakybucket.requests leakybucket.request.result=client_limiter leakybucket.shadow=true: 1
}
