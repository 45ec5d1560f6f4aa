package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// servers returns a client of an embedded miniredis and, if
// LEAKYBUCKET_REDIS_ADDR names one (make test starts it, scripting
// denied), of a real Redis, each with a prefix of this test's own.
func servers(t *testing.T) map[string]*redis.Client {
	t.Helper()
	m := miniredis.RunT(t)
	// miniredis keeps a TTL relative to its clock, and PEXPIRETIME adds it
	// to the time: a clock that stands still reads the same deadline.
	m.SetTime(time.Now())
	out := map[string]*redis.Client{"miniredis": redis.NewClient(&redis.Options{Addr: m.Addr()})}
	if addr := os.Getenv("LEAKYBUCKET_REDIS_ADDR"); addr != "" {
		out["redis"] = redis.NewClient(&redis.Options{Addr: addr})
	}
	for _, rdb := range out {
		t.Cleanup(func() { rdb.Close() })
	}
	return out
}

// run sends cmds in one MULTI/EXEC.
func run(t *testing.T, rdb *redis.Client, cmds ...[]any) {
	t.Helper()
	ctx := context.Background()
	if _, err := rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, cmd := range cmds {
			pipe.Do(ctx, cmd...)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A late writer never shortens a key's life, and a late take-back whose key
// is gone makes none: the adversary sends a take-back stamped up to 20 s
// before the hash's newest call (as late as resolveFor and takeBackFor
// allow; in the same epoch, whose hash it is), once while the hash lives
// and once after it was deleted. A hash made again of the negative count
// would let a sixth call into a window of five.
func TestLateTakeBackKeepsCounts(t *testing.T) {
	ctx := context.Background()
	for name, rdb := range servers(t) {
		for _, precision := range []time.Duration{time.Millisecond, 0} {
			t.Run(fmt.Sprintf("%s/precision=%v", name, precision), func(t *testing.T) {
				rules := []limits.Rule{{Requests: 5, Window: time.Minute.Milliseconds()}}
				s := NewWindows(Plan{Rules: rules, Longest: rules[0].Window}, precision).(windowsStore)
				ks := keys.Of(fmt.Sprintf("test%x", rand.Uint64()), "r")
				server, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				now, calls := server.UnixMilli(), []limits.Call{{Client: "c", N: 1}}
				write, tx := s.newBatch(ks, now, calls), txn.New(ks, true)
				write.queue(tx)
				if outcome, err := tx.Exec(ctx, rdb); outcome != txn.Ran {
					t.Fatalf("the decision's transaction: %v, %v", outcome, err)
				}
				hash := write.order[0].parts[0].keys[1]
				t.Cleanup(func() { rdb.Del(ctx, hash) }) // the marker expires in half a second
				before := rdb.PExpireTime(ctx, hash).Val()
				late := s.newBatch(ks, now-min(20_000, now%s.Epochs[0]), calls)
				back := late.subtract(nil, late.order[0], 0, 1)
				run(t, rdb, back...)
				if after := rdb.PExpireTime(ctx, hash).Val(); after != before {
					t.Errorf("PEXPIRETIME after a late take-back = %v; want %v: unchanged", after, before)
				}
				// As if it expired, or a FlushAll took it.
				run(t, rdb, append([][]any{{"del", hash}}, back...)...)
				if n, err := rdb.Exists(ctx, hash).Result(); err != nil || n != 0 {
					t.Errorf("EXISTS after a late take-back on a deleted hash = %d, %v; want 0: it made a hash of negative counts", n, err)
				}
			})
		}
	}
}
