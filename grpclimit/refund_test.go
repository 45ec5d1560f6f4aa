package grpclimit

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leakybucket/leakybucket"
)

// WithRefund(ServerFaults): a call whose handler ends Internal gets its
// weight back, one that ends OK or InvalidArgument keeps it.
func TestRefundServerFaults(t *testing.T) {
	b, err := leakybucket.NewLocal(leakybucket.WithStrategy(leakybucket.GCRA), leakybucket.PerClient(leakybucket.Per(2, time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	key := func(context.Context, string) (string, string, error) { return "svc", "c", nil }
	intercept, err := UnaryServerInterceptor(b, WithKey(key), WithRefund(ServerFaults))
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/Call"}
	for i, c := range []struct {
		ends, want codes.Code
	}{
		{codes.Internal, codes.Internal}, {codes.Internal, codes.Internal}, {codes.Internal, codes.Internal}, // given back
		{codes.OK, codes.OK}, {codes.InvalidArgument, codes.InvalidArgument}, // both kept
		{codes.OK, codes.ResourceExhausted}, {codes.Internal, codes.ResourceExhausted},
	} {
		handler := func(context.Context, any) (any, error) { return nil, status.Error(c.ends, "") }
		if c.ends == codes.OK {
			handler = func(context.Context, any) (any, error) { return "ok", nil }
		}
		_, err := intercept(context.Background(), nil, info, handler)
		if got := status.Code(err); got != c.want {
			t.Fatalf("call %d ending %v: %v, want %v", i, c.ends, got, c.want)
		}
	}
}
