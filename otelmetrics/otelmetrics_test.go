package otelmetrics

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
)

var (
	perResource = leakybucket.Rule{Limit: leakybucket.Per(2, time.Minute)}
	perClient   = leakybucket.Rule{PerClient: true, Limit: leakybucket.Per(1, time.Minute)}
)

// newObserver returns an observer that records on a MeterProvider read by
// the returned ManualReader.
func newObserver(t *testing.T, opts ...Option) (func(context.Context, leakybucket.Decision), *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	observe, err := New(mp, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return observe, reader
}

// collect returns what reader exports of this package's meter, by
// instrument name.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, ScopeName)
		}
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	return got
}

// A decision of each kind. latency is in µs.
var decisions = []struct {
	d       leakybucket.Decision
	latency int64
}{
	{leakybucket.Decision{Op: "allow", Resource: "r", Client: "a", N: 1, Allowed: true}, 200},
	{leakybucket.Decision{Op: "allow", Resource: "r", Client: "b", N: 1, Allowed: true}, 300},
	{leakybucket.Decision{Op: "allow", Resource: "r", Client: "a", N: 1, DeniedBy: []leakybucket.Rule{perClient}}, 1000},
	{leakybucket.Decision{Op: "allow", Resource: "r", Client: "a", N: 1, DeniedBy: []leakybucket.Rule{perResource, perClient}}, 1500},
	{leakybucket.Decision{Op: "allow", Resource: "r", Client: "c", N: 1, DeniedBy: []leakybucket.Rule{perResource}}, 1700},
	{errored("allow", fmt.Errorf("%w: %w", leakybucket.ErrUnavailable, syscall.ECONNREFUSED)), 2000},
	{errored("allow", fmt.Errorf("leakybucket: %w", context.DeadlineExceeded)), 5000},
	{errored("allow", leakybucket.ErrLockExpired), 7000},
	{errored("allow", leakybucket.ErrInvalidWeight), 1},
	{leakybucket.Decision{Op: "peek", Resource: "r", Client: "a", N: 1, Allowed: true}, 100},
	{leakybucket.Decision{Op: "flush", Resource: "r", Client: "a"}, 400},
	{errored("flush_all", leakybucket.ErrLockNotObtained), 900},
}

func errored(op string, err error) leakybucket.Decision {
	return leakybucket.Decision{Op: op, Resource: "r", Client: "a", N: 1, Err: err}
}

var (
	acquired = attribute.NewSet(ResultKey.String("acquired"))
	byClient = attribute.NewSet(ResultKey.String("client_limiter"), PolicyKey.String("per-client 1 per 1m0s"))
	byBoth   = attribute.NewSet(ResultKey.String("resource_limiter"),
		PolicyKey.String("per-resource 2 per 1m0s + per-client 1 per 1m0s"))
	byResource  = attribute.NewSet(ResultKey.String("resource_limiter"), PolicyKey.String("per-resource 2 per 1m0s"))
	unavailable = attribute.NewSet(ResultKey.String("error"), ErrorTypeKey.String("unavailable"))
	canceled    = attribute.NewSet(ResultKey.String("request_canceled"), ErrorTypeKey.String("deadline"))
	other       = attribute.NewSet(ResultKey.String("error"), ErrorTypeKey.String("_OTHER"))
	invalid     = attribute.NewSet(ResultKey.String("error"), ErrorTypeKey.String("invalid_input"))
)

// Every Allow counts once in leakybucket.requests, with its result, the
// rules that denied and the error's type; Peek, Flush and FlushAll only in
// the histogram.
func TestRequests(t *testing.T) {
	observe, reader := newObserver(t)
	for _, c := range decisions {
		c.d.Latency = time.Duration(c.latency) * time.Microsecond
		observe(context.Background(), c.d)
	}
	got := collect(t, reader)
	point := func(set attribute.Set, n int64) metricdata.DataPoint[int64] {
		return metricdata.DataPoint[int64]{Attributes: set, Value: n}
	}
	want := metricdata.Metrics{
		Name:        "leakybucket.requests",
		Description: "Number of requests that asked a leakybucket.Bucket for room (Allow, AllowN).",
		Unit:        "{request}",
		Data: metricdata.Sum[int64]{
			Temporality: metricdata.CumulativeTemporality,
			IsMonotonic: true,
			DataPoints: []metricdata.DataPoint[int64]{
				point(acquired, 2), point(byClient, 1), point(byBoth, 1), point(byResource, 1),
				point(unavailable, 1), point(canceled, 1), point(other, 1), point(invalid, 1),
			},
		},
	}
	metricdatatest.AssertEqual(t, want, got["leakybucket.requests"], metricdatatest.IgnoreTimestamp())
}

// Every call's latency is recorded in seconds, with its operation and the
// attributes of its outcome.
func TestDuration(t *testing.T) {
	observe, reader := newObserver(t)
	for _, c := range decisions {
		c.d.Latency = time.Duration(c.latency) * time.Microsecond
		observe(context.Background(), c.d)
	}
	m := collect(t, reader)["leakybucket.request.duration"]
	if m.Unit != "s" {
		t.Errorf("unit %q, want s", m.Unit)
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("leakybucket.request.duration is a %T, want a float64 histogram", m.Data)
	}
	with := func(set attribute.Set, op string) attribute.Set {
		return attribute.NewSet(append(set.ToSlice(), OperationKey.String(op))...)
	}
	wantSums := map[attribute.Set][]int64{ // the latencies in µs recorded under each set
		with(acquired, "allow"):              {200, 300},
		with(byClient, "allow"):              {1000},
		with(byBoth, "allow"):                {1500},
		with(byResource, "allow"):            {1700},
		with(unavailable, "allow"):           {2000},
		with(canceled, "allow"):              {5000},
		with(other, "allow"):                 {7000},
		with(invalid, "allow"):               {1},
		with(*attribute.EmptySet(), "peek"):  {100},
		with(*attribute.EmptySet(), "flush"): {400},
		with(attribute.NewSet(ErrorTypeKey.String("lock_not_obtained")), "flush_all"): {900},
	}
	if len(h.DataPoints) != len(wantSums) {
		t.Errorf("%d series, want %d", len(h.DataPoints), len(wantSums))
	}
	for _, p := range h.DataPoints {
		want, ok := wantSums[p.Attributes]
		if !ok {
			t.Errorf("unexpected series %v", p.Attributes.Encoded(attribute.DefaultEncoder()))
			continue
		}
		checkPoint(t, p, want)
	}
}

// checkPoint checks that p holds the latencies want, in µs, in the
// buckets of DurationBuckets.
func checkPoint(t *testing.T, p metricdata.HistogramDataPoint[float64], want []int64) {
	t.Helper()
	var sum int64
	for _, us := range want {
		sum += us
	}
	if p.Count != uint64(len(want)) || math.Abs(p.Sum-float64(sum)/1e6) > 1e-12 || !slices.Equal(p.Bounds, DurationBuckets) {
		t.Errorf("%v: count %d, sum %gs, bounds %v; want %d, %gs, %v", p.Attributes.Encoded(attribute.DefaultEncoder()),
			p.Count, p.Sum, p.Bounds, len(want), float64(sum)/1e6, DurationBuckets)
	}
}

// WithAttributes adds to every measurement.
func TestWithAttributes(t *testing.T) {
	observe, reader := newObserver(t, WithAttributes(attribute.String("leakybucket.name", "notify")))
	observe(context.Background(), leakybucket.Decision{Op: "allow", Allowed: true})
	for name, m := range collect(t, reader) {
		switch data := m.Data.(type) {
		case metricdata.Sum[int64]:
			metricdatatest.AssertHasAttributes(t, data, attribute.String("leakybucket.name", "notify"), ResultKey.String("acquired"))
		case metricdata.Histogram[float64]:
			metricdatatest.AssertHasAttributes(t, data, attribute.String("leakybucket.name", "notify"), OperationKey.String("allow"))
		default:
			t.Errorf("%s: unexpected %T", name, m.Data)
		}
	}
}

// Wired to a Bucket, on miniredis and on the real Redis that `make test`
// starts: two calls admitted, the third denied by the per-client rule,
// each counted once.
func TestBucket(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		testBucket(t, redis.NewClient(&redis.Options{Addr: mr.Addr()}))
	})
	t.Run("redis", func(t *testing.T) {
		addr := os.Getenv("LEAKYBUCKET_REDIS_ADDR")
		switch {
		case addr == "" && os.Getenv("CI") != "":
			t.Fatal("LEAKYBUCKET_REDIS_ADDR is not set: CI must run the real-Redis tests (use make test)")
		case addr == "":
			t.Skip("LEAKYBUCKET_REDIS_ADDR is not set; `make test` starts a scripting-denied Redis")
		}
		testBucket(t, redis.NewClient(&redis.Options{Addr: addr}))
	})
}

func testBucket(t *testing.T, rdb *redis.Client) {
	defer rdb.Close()
	prefix := fmt.Sprintf("otelmetrics-test-%d", time.Now().UnixNano())
	defer deletePrefix(rdb, prefix)
	observe, reader := newObserver(t)
	limiter, err := leakybucket.New(rdb, leakybucket.PerResource(perResource.Limit), leakybucket.PerClient(perClient.Limit),
		leakybucket.WithObserver(observe), leakybucket.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"a", "b", "a", "c"} {
		if _, err := limiter.Allow(context.Background(), "r", client); err != nil {
			t.Fatal(err)
		}
	}
	got := collect(t, reader)
	want := metricdata.Sum[int64]{
		Temporality: metricdata.CumulativeTemporality,
		IsMonotonic: true,
		DataPoints: []metricdata.DataPoint[int64]{
			{Attributes: acquired, Value: 2},
			{Attributes: byBoth, Value: 1},
			{Attributes: byResource, Value: 1},
		},
	}
	metricdatatest.AssertAggregationsEqual(t, want, got["leakybucket.requests"].Data, metricdatatest.IgnoreTimestamp())
	h := got["leakybucket.request.duration"].Data.(metricdata.Histogram[float64])
	var calls uint64
	for _, p := range h.DataPoints {
		calls += p.Count
		if p.Sum <= 0 {
			t.Errorf("%v: latencies sum to %gs", p.Attributes.Encoded(attribute.DefaultEncoder()), p.Sum)
		}
	}
	if calls != 4 {
		t.Errorf("%d latencies recorded, want 4", calls)
	}
}

// deletePrefix deletes the keys the test wrote.
func deletePrefix(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

// A nil MeterProvider means the global one, a no-op until one is set.
func TestNilMeterProvider(t *testing.T) {
	observe, err := New(nil)
	if err != nil || observe == nil {
		t.Fatalf("New(nil) = nil observer: %v, or error %v", observe == nil, err)
	}
	observe(context.Background(), leakybucket.Decision{Op: "allow", Allowed: true})
}

// errorType sorts errors in order: a lock or Redis failure joined with the
// context's error keeps its own type.
func TestErrorType(t *testing.T) {
	t.Parallel()
	unavailable := fmt.Errorf("%w: %w", leakybucket.ErrUnavailable, syscall.ECONNREFUSED)
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: n = 0", leakybucket.ErrInvalidWeight), "invalid_input"},
		{leakybucket.ErrEmptyResource, "invalid_input"},
		{leakybucket.ErrEmptyClient, "invalid_input"},
		{errors.Join(leakybucket.ErrLockNotObtained, context.DeadlineExceeded), "lock_not_obtained"},
		{unavailable, "unavailable"},
		{errors.Join(context.DeadlineExceeded, unavailable), "unavailable"},
		{fmt.Errorf("leakybucket: %w", context.DeadlineExceeded), "deadline"},
		{context.Canceled, "deadline"},
		{leakybucket.ErrLockExpired, "_OTHER"},
		{fmt.Errorf("leakybucket: %w", redis.Nil), "_OTHER"},
	} {
		if got := errorType(c.err); got != c.want {
			t.Errorf("errorType(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
