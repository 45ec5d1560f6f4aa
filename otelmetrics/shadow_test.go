package otelmetrics

import (
	"context"
	"maps"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The calls of a shadow run (a context of leakybucket.ContextWithShadow,
// as httplimit.WithShadow and grpclimit.WithShadow make them) carry
// leakybucket.shadow=true on both instruments, with the result and policy
// they would have had; the other calls keep their series.
func TestShadow(t *testing.T) {
	observe, reader := newObserver(t)
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	b, err := leakybucket.New(rdb, leakybucket.PerClient(perClient.Limit), leakybucket.WithObserver(observe))
	if err != nil {
		t.Fatal(err)
	}
	shadow := leakybucket.ContextWithShadow(context.Background())
	for _, ctx := range []context.Context{shadow, shadow, context.Background()} {
		if _, err := b.Allow(ctx, "r", "a"); err != nil {
			t.Fatal(err)
		}
	}
	marked := ShadowKey.Bool(true)
	shadowAcquired := attribute.NewSet(ResultKey.String("acquired"), marked)
	shadowByClient := attribute.NewSet(append(byClient.ToSlice(), marked)...)
	want := map[attribute.Distinct]int64{
		shadowAcquired.Equivalent(): 1,
		shadowByClient.Equivalent(): 1,
		byClient.Equivalent():       1,
	}
	got := collect(t, reader)
	counts := map[attribute.Distinct]int64{}
	for _, p := range got["leakybucket.requests"].Data.(metricdata.Sum[int64]).DataPoints {
		counts[p.Attributes.Equivalent()] = p.Value
	}
	if !maps.Equal(counts, want) {
		t.Errorf("leakybucket.requests: %v, want %v", got["leakybucket.requests"].Data, want)
	}
	h := got["leakybucket.request.duration"].Data.(metricdata.Histogram[float64])
	shadowed := 0
	for _, p := range h.DataPoints {
		if v, ok := p.Attributes.Value(ShadowKey); ok && v.AsBool() {
			shadowed += int(p.Count)
		}
	}
	if shadowed != 2 {
		t.Errorf("leakybucket.request.duration: %d calls with %s=true, want 2", shadowed, ShadowKey)
	}
}
