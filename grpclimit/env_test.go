package grpclimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// The tests run a real gRPC server, the standard health service, on a
// loopback port chosen at run time, limited by a Bucket on the real Redis
// at $LEAKYBUCKET_REDIS_ADDR (`make test` starts one, scripting denied).
// Without the address they are skipped, except under CI, where they fail.

const redisAddrVar = "LEAKYBUCKET_REDIS_ADDR"

// realBucket returns a Bucket of opts on the real Redis, with a prefix of
// the test's own whose keys are deleted afterwards; or skips the test
// (fails it under CI).
func realBucket(t *testing.T, opts ...leakybucket.Option) *leakybucket.Bucket {
	t.Helper()
	addr := os.Getenv(redisAddrVar)
	if addr == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the real-Redis tests (use make test)", redisAddrVar)
		}
		t.Skipf("%s is not set; `make test` starts a scripting-denied Redis", redisAddrVar)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	var b [6]byte
	_, _ = rand.Read(b[:])
	prefix := "grpclimit-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	})
	return newBucket(t, rdb, append(opts, leakybucket.WithPrefix(prefix))...)
}

func newBucket(t *testing.T, rdb redis.UniversalClient, opts ...leakybucket.Option) *leakybucket.Bucket {
	t.Helper()
	b, err := leakybucket.New(rdb, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve starts a health server limited by b with opts, on a loopback port
// of its own, and returns a client of it; both stop when the test ends.
func serve(t *testing.T, b *leakybucket.Bucket, opts ...Option) healthpb.HealthClient {
	t.Helper()
	unary, err := UnaryServerInterceptor(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := StreamServerInterceptor(b, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// clientKey is a KeyFunc of the tests: the full method and the
// "x-client" metadata, as a service keys by an authenticated identity.
func clientKey(ctx context.Context, fullMethod string) (string, string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-client"); len(v) > 0 {
		return fullMethod, v[0], nil
	}
	return fullMethod, "", nil
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// as returns ctx with the metadata of client.
func as(ctx context.Context, client string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-client", client)
}
