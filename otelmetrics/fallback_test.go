//go:build linux

package otelmetrics

import (
	"context"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/internal/redisserver"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestFallbackSwitch: a Bucket WithFallback(2) on a real Redis that is
// killed, then restarted: the calls its fallback decides in process carry
// leakybucket.fallback=true, with the share of the rule as the policy, and
// once Redis is back the calls count without it again: the metrics show
// the switch both ways.
func TestFallbackSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real server")
	}
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	observe, reader := newObserver(t)
	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(10)), leakybucket.WithFallback(2),
		leakybucket.WithObserver(observe))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	allow := func(client string) leakybucket.Result {
		t.Helper()
		res, err := limiter.Allow(ctx, "r", client)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	allow("a")
	inProcess := attribute.NewSet(ResultKey.String(ResultAcquired), FallbackKey.Bool(true))
	deniedInProcess := attribute.NewSet(ResultKey.String(ResultClientLimiter), PolicyKey.String("per-client 5 per 1m0s"), FallbackKey.Bool(true))
	checkRequests(t, reader, map[attribute.Set]int64{acquired: 1})

	srv.Kill()
	for range 7 {
		allow("b") // the share, 5 of 10, then 2 denials
	}
	checkRequests(t, reader, map[attribute.Set]int64{acquired: 1, inProcess: 5, deniedInProcess: 2})

	srv.Restart(t)
	start, fallback := time.Now(), int64(0)
	for allow("c").Fallback {
		fallback++
		if time.Since(start) > 5*time.Second {
			t.Fatal("not decided by Redis within 5s of the restart")
		}
		time.Sleep(5 * time.Millisecond)
	}
	allow("c")
	checkRequests(t, reader, map[attribute.Set]int64{acquired: 3, inProcess: 5 + fallback, deniedInProcess: 2})
}

// checkRequests checks leakybucket.requests's series against want.
func checkRequests(t *testing.T, reader interface {
	Collect(context.Context, *metricdata.ResourceMetrics) error
}, want map[attribute.Set]int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[attribute.Set]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "leakybucket.requests" {
				for _, p := range sum.DataPoints {
					got[p.Attributes] = p.Value
				}
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d series of leakybucket.requests, want %d: %v", len(got), len(want), got)
	}
	for set, n := range want {
		if got[set] != n {
			t.Errorf("leakybucket.requests{%s} = %d, want %d", set.Encoded(attribute.DefaultEncoder()), got[set], n)
		}
	}
}
