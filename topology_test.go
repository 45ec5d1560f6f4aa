package leakybucket

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// The Bucket drives a *redis.ClusterClient (miniredis emulates a cluster of
// one node that owns every slot) and a *redis.Ring of two shards through the
// same decisions as a *redis.Client. A real multi-master cluster is a
// separate suite.
func TestClusterAndRingClients(t *testing.T) {
	t.Parallel()
	one, two := miniredis.RunT(t), miniredis.RunT(t)
	for name, rdb := range map[string]redis.UniversalClient{
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{one.Addr()}}),
		"ring":    redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": one.Addr(), "b": two.Addr()}}),
	} {
		t.Run(name, func(t *testing.T) {
			defer rdb.Close()
			ctx := context.Background()
			b, err := New(rdb, WithPrefix(name), PerResource(Per(3, time.Minute)), PerClient(Per(2, time.Minute)))
			if err != nil {
				t.Fatal(err)
			}
			resources := []string{"r0", "r1", "r2", "r3", "{r}", "*"} // spread over the shards
			for _, r := range resources {
				for i, c := range []string{"a", "a", "a", "b", "c"} {
					res, err := b.Allow(ctx, r, c)
					if want := i != 2 && i != 4; err != nil || res.Allowed != want {
						t.Fatalf("call %d Allow(%q, %q) = %+v, %v; want Allowed %v", i, r, c, res, err, want)
					}
				}
				if err := b.Flush(ctx, r, "a"); err != nil {
					t.Fatal(err)
				}
				if res, err := b.Peek(ctx, r, "c"); err != nil || res.Remaining != 1 || !res.Allowed {
					t.Errorf("Peek(%q, c) after Flush(a) = %+v, %v; want admitted with 1 left (b and c count)", r, res, err)
				}
			}
			if n := len(one.Keys()); n == 0 || (name == "ring" && len(two.Keys()) == 0) {
				t.Errorf("keys per shard: %d and %d; want resources on both", n, len(two.Keys()))
			}
		})
	}
}
