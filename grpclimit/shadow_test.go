package grpclimit

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/inflight"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// observer sends each Decision to heard, without its Latency, the only
// field two runs need not share.
func observer(heard chan<- leakybucket.Decision) leakybucket.Option {
	return leakybucket.WithObserver(func(_ context.Context, d leakybucket.Decision) {
		d.Latency = 0
		heard <- d
	})
}

// shadowRun is a server on a fresh miniredis whose clock stands still,
// limited to 5 calls a minute per method and 3 per 10 s per client, with
// what its Bucket's observer heard.
type shadowRun struct {
	c     healthpb.HealthClient
	mr    *miniredis.Miniredis
	heard chan leakybucket.Decision
}

var shadowStart = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func newShadowRun(t *testing.T, opts ...Option) shadowRun {
	t.Helper()
	run := shadowRun{mr: miniredis.RunT(t), heard: make(chan leakybucket.Decision, 4)}
	run.mr.SetTime(shadowStart)
	run.mr.ClockTTL(true)
	rdb := redis.NewClient(&redis.Options{Addr: run.mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	b := newBucket(t, rdb, leakybucket.PerResource(leakybucket.PerMinute(5)),
		leakybucket.PerClient(leakybucket.Per(3, 10*time.Second)), observer(run.heard))
	run.c = serve(t, b, append([]Option{WithKey(clientKey)}, opts...)...)
	return run
}

// check makes one unary call as client at the time after, and returns its
// code and trailer.
func (run shadowRun) check(t *testing.T, client string, after time.Duration) (codes.Code, metadata.MD) {
	t.Helper()
	run.mr.SetTime(shadowStart.Add(after))
	var trailer metadata.MD
	_, err := run.c.Check(as(context.Background(), client), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	return status.Code(err), trailer
}

// TestShadow makes one sequence of calls to an enforcing server and a
// shadow one, each on a fresh Redis: the shadow one serves every call,
// with the same trailer and the same Decisions (marked Shadow).
func TestShadow(t *testing.T) {
	t.Parallel()
	enforcing, shadow := newShadowRun(t), newShadowRun(t, WithShadow())
	steps := []struct {
		after  time.Duration
		client string
	}{
		{0, "alice"}, {time.Second, "alice"}, {time.Second, "alice"},
		{2 * time.Second, "alice"}, // the 4th of a client: denied per client
		{3 * time.Second, "bob"}, {3 * time.Second, "bob"},
		{4 * time.Second, "carol"},  // the method is full: denied per resource
		{11 * time.Second, "alice"}, // the client has room, the method none
		{61 * time.Second, "alice"}, // both have room
	}
	denials := 0
	for i, s := range steps {
		ce, te := enforcing.check(t, s.client, s.after)
		cs, ts := shadow.check(t, s.client, s.after)
		if ce == codes.ResourceExhausted {
			denials++
		} else if ce != codes.OK {
			t.Fatalf("step %d: enforcing %v, want OK or ResourceExhausted", i, ce)
		}
		if cs != codes.OK {
			t.Errorf("step %d: shadow %v, want OK", i, cs)
		}
		checkTrailers(t, i, te, ts)
		checkHeard(t, i, enforcing.heard, shadow.heard)
	}
	if denials != 3 {
		t.Errorf("the enforcing server denied %d calls, want 3", denials)
	}
}

// checkTrailers checks that the shadow run sent the enforcing run's
// RateLimit fields.
func checkTrailers(t *testing.T, step int, enforcing, shadow metadata.MD) {
	t.Helper()
	for _, k := range []string{TrailerPolicy, TrailerRateLimit, TrailerRetryAfter} {
		if e, s := enforcing.Get(k), shadow.Get(k); !slices.Equal(e, s) {
			t.Errorf("step %d: trailer %s: shadow %q, enforcing %q", step, k, s, e)
		}
	}
}

// checkHeard checks that the shadow run's observer heard one Decision,
// the enforcing run's but marked Shadow.
func checkHeard(t *testing.T, step int, enforcing, shadow chan leakybucket.Decision) {
	t.Helper()
	if len(enforcing) != 1 || len(shadow) != 1 {
		t.Fatalf("step %d: heard %d and %d decisions, want 1 each", step, len(enforcing), len(shadow))
	}
	e, s := <-enforcing, <-shadow
	if e.Shadow = !e.Shadow; !reflect.DeepEqual(e, s) {
		t.Errorf("step %d: shadow heard %+v, want %+v", step, s, e)
	}
}

// A stream that would be denied is served under WithShadow.
func TestShadowStream(t *testing.T) {
	t.Parallel()
	run := newShadowRun(t, WithShadow())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 4 {
		w, err := run.c.Watch(as(ctx, "alice"), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stream %d: %v, want served", i+1, err)
		}
	}
	if len(run.heard) != 4 {
		t.Fatalf("heard %d decisions, want 4", len(run.heard))
	}
	<-run.heard
	<-run.heard
	<-run.heard
	if d := <-run.heard; d.Allowed || !d.Shadow {
		t.Errorf("the 4th stream was heard as %+v, want denied in shadow", d)
	}
}

// Under WithShadow a call WithInFlight refuses is served, holding no
// lease and not asked of the Bucket, as the enforcing interceptor refuses
// it without asking.
func TestShadowInFlight(t *testing.T) {
	t.Parallel()
	for _, shadowed := range []bool{false, true} {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { rdb.Close() })
		l, err := inflight.New(rdb, inflight.PerResource(1))
		if err != nil {
			t.Fatal(err)
		}
		le, err := l.Acquire(context.Background(), healthpb.Health_Check_FullMethodName, "alice")
		if err != nil {
			t.Fatal(err)
		}
		heard := make(chan leakybucket.Decision, 1)
		b := newBucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(3)), observer(heard))
		opts := []Option{WithKey(clientKey), WithInFlight(l, 0)}
		want := codes.ResourceExhausted
		if shadowed {
			opts, want = append(opts, WithShadow()), codes.OK
		}
		_, err = serve(t, b, opts...).Check(as(context.Background(), "alice"), &healthpb.HealthCheckRequest{})
		if status.Code(err) != want || len(heard) != 0 {
			t.Errorf("shadow %t: %v; want %v, and the Bucket not asked", shadowed, err, want)
		}
		_ = le.Release(context.Background())
	}
}
