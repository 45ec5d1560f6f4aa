package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/grpclimit"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// A gRPC server whose clients may call each method 3 times a minute; the
// 4th call is ResourceExhausted, and RetryInfo says when to come back.
func ExampleUnaryServerInterceptor() {
	// An in-memory Redis whose clock stands still: pass New your own client.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(3)))
	if err != nil {
		log.Fatal(err)
	}
	unary, err := grpclimit.UnaryServerInterceptor(limiter)
	if err != nil {
		log.Fatal(err)
	}
	stream, err := grpclimit.StreamServerInterceptor(limiter)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(s, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	defer s.Stop()

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 4 {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		st, _ := status.FromError(err)
		fmt.Print(st.Code())
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				fmt.Print(": retry in ", ri.GetRetryDelay().AsDuration())
			}
		}
		fmt.Println()
	}
	// Output:
	// OK
	// OK
	// OK
	// ResourceExhausted: retry in 1m0s
}

// A limit of 3 calls a minute, tried out before it is enforced: every
// call is served, with the trailer the limit would send, and the Bucket's
// observer (for metrics) hears the call it would have denied.
func ExampleWithShadow() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	limiter, err := leakybucket.New(rdb, leakybucket.PerClient(leakybucket.PerMinute(3)),
		leakybucket.WithObserver(func(_ context.Context, d leakybucket.Decision) {
			if !d.Allowed && d.Shadow {
				fmt.Println("would deny", d.Resource)
			}
		}))
	if err != nil {
		log.Fatal(err)
	}
	unary, err := grpclimit.UnaryServerInterceptor(limiter, grpclimit.WithShadow())
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(unary))
	healthpb.RegisterHealthServer(s, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	defer s.Stop()

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for range 4 {
		var trailer metadata.MD
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		fmt.Println(status.Code(err), trailer.Get(grpclimit.TrailerRateLimit), trailer.Get(grpclimit.TrailerRetryAfter))
	}
	// Output:
	// OK ["per-client-60s";r=2;t=60] []
	// OK ["per-client-60s";r=1;t=60] []
	// OK ["per-client-60s";r=0;t=60] []
	// would deny /grpc.health.v1.Health/Check
	// OK ["per-client-60s";r=0;t=60] [60]
}
