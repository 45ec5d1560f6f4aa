package grpclimit

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/inflight"
)

// TestInFlight: a stream holds its lease while open; a call that finds
// no room fails with ResourceExhausted and is charged nothing by the
// Bucket; once the stream ends, calls are served again.
func TestInFlight(t *testing.T) {
	t.Parallel()
	var decided atomic.Int64
	b := realBucket(t, leakybucket.PerClient(leakybucket.PerMinute(10)),
		leakybucket.WithObserver(func(_ context.Context, d leakybucket.Decision) {
			if d.Op == "allow" {
				decided.Add(1)
			}
		}))
	l, err := inflight.NewLocal(inflight.PerClient(1))
	if err != nil {
		t.Fatal(err)
	}
	oneResource := func(ctx context.Context, method string) (string, string, error) {
		_, client, err := clientKey(ctx, method)
		return "health", client, err // Watch and Check share the limit
	}
	c := serve(t, b, WithKey(oneResource), WithInFlight(l, 0))
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.Watch(as(ctx, "alice"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil { // the stream is open, its lease held
		t.Fatal(err)
	}
	_, err = c.Check(as(context.Background(), "alice"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second call in flight: %v, want ResourceExhausted", err)
	}
	if n := decided.Load(); n != 1 {
		t.Errorf("the Bucket decided %d calls, want 1: the refused one was charged", n)
	}
	cancel()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, err := c.Check(as(context.Background(), "alice"), &healthpb.HealthCheckRequest{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) || status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("after the stream ended: %v", err)
		}
	}
}
