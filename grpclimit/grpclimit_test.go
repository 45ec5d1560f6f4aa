package grpclimit

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The 4th call of a client allowed 3 a minute is ResourceExhausted, with a
// RetryInfo delay in (0, 1m] and the RateLimit fields in its trailer;
// another client is served.
func TestUnaryDenial(t *testing.T) {
	t.Parallel()
	c := serve(t, realBucket(t, leakybucket.PerClient(leakybucket.PerMinute(3))), WithKey(clientKey))
	ctx := context.Background()
	for i := range 3 {
		var trailer metadata.MD
		if _, err := c.Check(as(ctx, "alice"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer)); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		checkTrailer(t, trailer, TrailerPolicy, `"per-client-60s";q=3;w=60`)
		checkTrailer(t, trailer, TrailerRateLimit, `"per-client-60s";r=`+strconv.Itoa(2-i)+";t=60")
	}
	var trailer metadata.MD
	_, err := c.Check(as(ctx, "alice"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	checkDenied(t, err)
	if got := trailer.Get(TrailerRateLimit); len(got) != 1 || !strings.HasPrefix(got[0], `"per-client-60s";r=0;t=`) {
		t.Errorf("denied: %s %q", TrailerRateLimit, got)
	}
	if got := trailer.Get(TrailerRetryAfter); len(got) != 1 || !inRange(got[0], 1, 60) {
		t.Errorf("denied: %s %q, want 1 to 60", TrailerRetryAfter, got)
	}
	if _, err := c.Check(as(ctx, "bob"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another client: %v, want served", err)
	}
}

// checkTrailer checks that md has one value of key, want.
func checkTrailer(t *testing.T, md metadata.MD, key, want string) {
	t.Helper()
	if got := md.Get(key); len(got) != 1 || got[0] != want {
		t.Errorf("trailer %s: %q, want %q", key, got, want)
	}
}

// inRange reports whether s is an integer from lo to hi.
func inRange(s string, lo, hi int) bool {
	n, err := strconv.Atoi(s)
	return err == nil && lo <= n && n <= hi
}

// checkDenied checks that err is ResourceExhausted with a RetryInfo delay
// in (0, 1m].
func checkDenied(t *testing.T, err error) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("denied call: %v, want ResourceExhausted", err)
	}
	var delay time.Duration
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delay = ri.GetRetryDelay().AsDuration()
		}
	}
	if delay <= 0 || delay > time.Minute {
		t.Errorf("RetryInfo delay %v (details %v), want in (0, 1m]", delay, st.Details())
	}
}

// A stream is one call, decided when it opens: the 3rd stream of a client
// allowed 2 a minute fails, whatever the first two receive.
func TestStreamsLimitedPerStream(t *testing.T) {
	t.Parallel()
	c := serve(t, realBucket(t, leakybucket.PerClient(leakybucket.PerMinute(2))), WithKey(clientKey))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		w, err := c.Watch(as(ctx, "alice"), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stream %d: %v, want served", i+1, err)
		}
	}
	w, err := c.Watch(as(ctx, "alice"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Recv()
	checkDenied(t, err)
	if got := w.Trailer().Get(TrailerRateLimit); len(got) != 1 || !strings.HasPrefix(got[0], `"per-client-60s";r=0;t=`) {
		t.Errorf("denied stream: trailer %s %q", TrailerRateLimit, got)
	}
}

// By default the client is the peer's IP: every connection from the
// loopback shares one count, per method.
func TestPeerKey(t *testing.T) {
	t.Parallel()
	c := serve(t, realBucket(t, leakybucket.PerClient(leakybucket.PerMinute(1))))
	ctx := context.Background()
	if _, err := c.Check(as(ctx, "alice"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := c.Check(as(ctx, "bob"), &healthpb.HealthCheckRequest{})
	checkDenied(t, err)
}

// Redis refusing connections: closed answers Unavailable; open serves the
// call and reports the error (ErrUnavailable, or the deadline of the
// decision on a loaded machine); a call that cannot be keyed is refused
// either way.
func TestFailure(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: closedAddr(t), MaxRetries: -1})
	defer rdb.Close()
	b := newBucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(1)))
	ctx := context.Background()
	closed := serve(t, b, WithKey(clientKey), WithDecisionTimeout(time.Second))
	if _, err := closed.Check(as(ctx, "alice"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("fail closed: %v, want Unavailable", err)
	}
	var reported atomic.Int32
	open := serve(t, b, WithKey(clientKey), WithFailOpen(func(_ context.Context, method string, err error) {
		if method == healthpb.Health_Check_FullMethodName && (errors.Is(err, leakybucket.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
			reported.Add(1)
		}
	}))
	if _, err := open.Check(as(ctx, "alice"), &healthpb.HealthCheckRequest{}); err != nil || reported.Load() != 1 {
		t.Errorf("fail open: %v, %d reported; want served and 1", err, reported.Load())
	}
	if _, err := open.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no client key, failing open: %v, want InvalidArgument", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: closedAddr(t)}) // never dialled: New sends nothing
	defer rdb.Close()
	b := newBucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(1)))
	for name, c := range map[string]struct {
		b   *leakybucket.Bucket
		opt Option
	}{
		"nil Bucket":       {nil, nil},
		"nil KeyFunc":      {b, WithKey(nil)},
		"negative timeout": {b, WithDecisionTimeout(-time.Second)},
	} {
		if _, err := UnaryServerInterceptor(c.b, c.opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("unary, %s: %v, want ErrInvalidOption", name, err)
		}
		if _, err := StreamServerInterceptor(c.b, c.opt); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("stream, %s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, _, err := PeerKey(context.Background(), "/m"); !errors.Is(err, ErrNoPeer) {
		t.Errorf("PeerKey without a peer: %v, want ErrNoPeer", err)
	}
}
