package txn

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// The facts a time fence rests on (issue #51's fenced decisions, the
// leaky bucket's compare-and-swap), checked on miniredis, the real Redis
// and the real cluster of make test: a key SET with PXAT s and WATCHed
// makes EXEC run before s or not at all, but only where the WATCH ran
// before s. A pipeline that carries its own fence, and reaches Redis
// after s as a whole (a process that stalled before sending it, bytes
// held up on the way), sets no key at all (SET with a PXAT already past
// writes nothing), watches nothing, and commits: such a fence fences
// nothing, and only the TIME in the transaction tells that it ran late.
// So a fence must be set and watched in a round trip before the one that
// carries the EXEC.

// A fenceSite is one server of a test: a client of the node that owns
// the keys, and how to move its clock past a deadline.
type fenceSite struct {
	rdb *redis.Client
	// now returns the server's time, in Unix ms.
	now func(t *testing.T) int64
	// pass moves the server's clock past ms: for real, by waiting for it.
	pass func(t *testing.T, ms int64)
}

// fenceSites returns miniredis, and the real Redis and the cluster's node
// of the fence's slot where make test gives them (CI must).
func fenceSites(t *testing.T) map[string]func(t *testing.T) fenceSite {
	sites := map[string]func(t *testing.T) fenceSite{"miniredis": miniSite}
	if addr := os.Getenv("LEAKYBUCKET_REDIS_ADDR"); addr != "" {
		sites["redis"] = func(t *testing.T) fenceSite {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			t.Cleanup(func() { rdb.Close() })
			return realSite(t, rdb)
		}
	} else if os.Getenv("CI") != "" {
		t.Fatal("LEAKYBUCKET_REDIS_ADDR is not set: CI must run the real-Redis half (use make test)")
	}
	if addrs := os.Getenv("LEAKYBUCKET_CLUSTER_ADDRS"); addrs != "" {
		sites["cluster"] = func(t *testing.T) fenceSite {
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
			t.Cleanup(func() { cc.Close() })
			node, err := cc.MasterForKey(context.Background(), fenceKey)
			if err != nil {
				t.Fatal(err)
			}
			return realSite(t, node)
		}
	} else if os.Getenv("CI") != "" {
		t.Fatal("LEAKYBUCKET_CLUSTER_ADDRS is not set: CI must run the cluster half (use make test)")
	}
	return sites
}

func miniSite(t *testing.T) fenceSite {
	mr := miniredis.RunT(t)
	start := time.UnixMilli(1_700_000_000_000)
	mr.SetTime(start)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	at := start.UnixMilli()
	return fenceSite{rdb: rdb,
		now: func(*testing.T) int64 { return at },
		pass: func(_ *testing.T, ms int64) {
			// miniredis expires keys when FastForward moves its TTLs, and
			// answers TIME from SetTime: move both.
			d := time.Duration(ms+1-at) * time.Millisecond
			at = ms + 1
			mr.SetTime(time.UnixMilli(at))
			mr.FastForward(d)
		}}
}

func realSite(t *testing.T, rdb *redis.Client) fenceSite {
	t.Cleanup(func() { rdb.Del(context.Background(), fenceKey, fencedKey) })
	now := func(t *testing.T) int64 {
		tm, err := rdb.Time(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	return fenceSite{rdb: rdb, now: now, pass: func(t *testing.T, ms int64) {
		for now(t) <= ms {
			time.Sleep(time.Millisecond) // the server's clock: nothing else moves it
		}
	}}
}

// The keys share a hash tag, so that the cluster keeps them on one node.
const (
	fenceKey  = "lbtest:{fence}:f"
	fencedKey = "lbtest:{fence}:x"
)

// watchFence sets the fence to expire at s and WATCHes it, on conn.
func watchFence(t *testing.T, conn *redis.Conn, s int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "set", fenceKey, 1, "pxat", s)
		p.Do(ctx, "watch", fenceKey)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// execFenced runs MULTI; SET fencedKey v; EXEC on conn and returns
// EXEC's error (redis.TxFailedErr if it was aborted).
func execFenced(conn *redis.Conn, v string) error {
	ctx := context.Background()
	_, err := conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, fencedKey, v, 0)
		return nil
	})
	return err
}

func TestTimeFence(t *testing.T) {
	ctx := context.Background()
	for name, site := range fenceSites(t) {
		t.Run(name+"/an EXEC after the fence is aborted", func(t *testing.T) {
			s := site(t)
			conn := s.rdb.Conn()
			defer conn.Close()
			fence := s.now(t) + 30
			watchFence(t, conn, fence)
			s.pass(t, fence)
			if err := execFenced(conn, "late"); !errors.Is(err, redis.TxFailedErr) {
				t.Fatalf("EXEC after the fence: %v, want %v", err, redis.TxFailedErr)
			}
			if n := s.rdb.Exists(ctx, fencedKey).Val(); n != 0 {
				t.Fatal("an aborted EXEC wrote its key")
			}
		})
		t.Run(name+"/an EXEC before the fence commits", func(t *testing.T) {
			s := site(t)
			conn := s.rdb.Conn()
			defer conn.Close()
			watchFence(t, conn, s.now(t)+10_000)
			if err := execFenced(conn, "in time"); err != nil {
				t.Fatalf("EXEC within the fence: %v", err)
			}
			if v := s.rdb.Get(ctx, fencedKey).Val(); v != "in time" {
				t.Fatalf("the key holds %q, want %q", v, "in time")
			}
		})
		t.Run(name+"/a fence that arrives after its deadline fences nothing", func(t *testing.T) {
			s := site(t)
			conn := s.rdb.Conn()
			defer conn.Close()
			// One pipeline, as a decision of one round trip would send it,
			// reaching Redis after its own fence's deadline.
			watchFence(t, conn, s.now(t)-10)
			if n := s.rdb.Exists(ctx, fenceKey).Val(); n != 0 {
				t.Fatal("SET with a PXAT already past made a key")
			}
			if err := execFenced(conn, "unfenced"); err != nil {
				t.Fatalf("EXEC behind a fence that was never set: %v, want it to commit", err)
			}
			if v := s.rdb.Get(ctx, fencedKey).Val(); v != "unfenced" {
				t.Fatalf("the key holds %q, want %q", v, "unfenced")
			}
		})
	}
}
