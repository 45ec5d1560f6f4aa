package leakybucket

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// Memory: what a Bucket leaves in Redis, and for how long (docs/design.md,
// "Expiry").

// runTxn runs cmds in one MULTI/EXEC as the test's own client.
func runTxn(t *testing.T, e *env, cmds ...[]any) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.admin.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, cmd := range cmds {
			pipe.Do(ctx, cmd...)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// deadlineOf is key's PEXPIRETIME.
func deadlineOf(t *testing.T, e *env, key string) int64 {
	t.Helper()
	at, err := e.admin.Do(context.Background(), "pexpiretime", key).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// serverMillis is Redis's time.
func serverMillis(t *testing.T, e *env) int64 {
	t.Helper()
	now, err := e.admin.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// mustAllowN calls AllowN and fails unless it answers allowed.
func mustAllowN(t *testing.T, b *Bucket, client string, n int, allowed bool) {
	t.Helper()
	res, err := b.AllowN(context.Background(), "r", client, n)
	if err != nil || res.Allowed != allowed {
		t.Fatalf("AllowN(%.20q, %d) = %+v, %v; want Allowed %v", client, n, res, err, allowed)
	}
}

// memoryStrategies are the strategies whose keys' lives are checked: each
// of the behaviour suite's, a coarser precision and fixed windows.
var memoryStrategies = []Strategy{Logs, SortedSet, Windows(time.Millisecond), Windows(250 * time.Millisecond), FixedWindows}

// expiryBound is how long after the window of its newest call ends a key
// may live: max(precision, 1s).
func expiryBound(s Strategy) time.Duration {
	if w, ok := s.(windowsStrategy); ok {
		return max(w.precision, time.Second)
	}
	return time.Second
}

// Every key of every strategy expires at most max(precision, 1s) after the
// window of its newest call ends, and not before: its PTTL right after
// the last call is measured, and then the keys are seen gone once that
// deadline passed.
func TestIdleKeysExpire(t *testing.T) {
	eachOf(t, memoryStrategies, func(t *testing.T, e *env) {
		e.needsRedis(t, "keys that expire")
		const window = time.Second
		b := e.bucket(t, PerResource(Per(5, window)), PerClient(Per(3, window)))
		ctx := context.Background()
		var sent time.Time
		for i := range 4 { // the last one denied: it counts for no one, and no key lives longer for it
			sent = time.Now()
			if _, err := b.AllowN(ctx, "r", fmt.Sprint("c", i%2), 1+i%2); err != nil {
				t.Fatal(err)
			}
		}
		keys := e.countKeys(t)
		if len(keys) == 0 {
			t.Fatal("no keys after the calls")
		}
		last := checkTTLs(t, e, keys, window, sent)
		time.Sleep(last + 5*time.Millisecond)
		if left := e.keys(t); len(left) > 0 {
			t.Errorf("keys left %v after their deadline: %q", last, left)
		}
	})
}

// checkTTLs checks the PTTL of each key right after a call sent at sent
// with rules of window, and returns the longest.
func checkTTLs(t *testing.T, e *env, keys []string, window time.Duration, sent time.Time) time.Duration {
	t.Helper()
	bound := window + expiryBound(e.strategy)
	var last time.Duration
	for _, key := range keys {
		ttl, err := e.admin.PTTL(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(sent)
		if ttl > bound || ttl < 0 {
			t.Errorf("%s: PTTL %v after its last call: want at most %v (the window, and %v)", key, ttl, bound, expiryBound(e.strategy))
		}
		// Not before the call's window ends (a fixed window's ends
		// sooner, and a log's is its own): its stamp trails Redis's time
		// by at most its round trip.
		if ttl+elapsed < window-clock.Jump && e.strategy != FixedWindows && !strings.Contains(key, ":log:") {
			t.Errorf("%s: PTTL %v, %v after the last call: it would expire before the call's window ends", key, ttl, elapsed)
		}
		last = max(last, ttl)
	}
	return last
}

// extendTo only ever moves a deadline later, and a key it finds made by its
// own transaction gets its first; dropIfMade deletes only a key so made.
func TestExpiryCommands(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "expiry commands")
		ctx := context.Background()
		key := e.prefix + ":{x}:k"
		now := serverMillis(t, e)
		want := func(at int64, after string) {
			t.Helper()
			if got := deadlineOf(t, e, key); got != at {
				t.Errorf("deadline after %s = %d, want %d", after, got, at)
			}
		}
		runTxn(t, e, append([][]any{{"hincrby", key, "f", 1}}, txn.ExtendTo(key, now+60_000)...)...)
		want(now+60_000, "a new key's first")
		runTxn(t, e, append([][]any{{"hincrby", key, "f", 1}}, txn.ExtendTo(key, now+30_000)...)...)
		want(now+60_000, "an earlier one")
		runTxn(t, e, txn.ExtendTo(key, now-1)...)
		runTxn(t, e, []any{"hincrby", key, "f", -1}, txn.DropIfMade(key))
		want(now+60_000, "a past one and a take-back")
		runTxn(t, e, txn.ExtendTo(key, now+90_000)...)
		want(now+90_000, "a later one")
		runTxn(t, e, []any{"del", key}, []any{"hincrby", key, "f", -1}, txn.DropIfMade(key))
		if n, err := e.admin.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Errorf("a take-back made the key again: EXISTS = %d, %v", n, err)
		}
	})
}

// Windows' generation outlives the hashes of its own generation: calls
// that keep coming after a FlushAll, past the generation's own life, are
// still counted (they were forgotten when the generation's key expired
// under them, and the names started again).
func TestGenerationOutlivesItsHashes(t *testing.T) {
	eachOf(t, []Strategy{Windows(time.Millisecond)}, func(t *testing.T, e *env) {
		if e.mini == nil {
			t.Skip("on fake time only: the generation lives seconds")
		}
		b := e.bucket(t, PerResource(Per(1, time.Second)))
		ctx := context.Background()
		if err := b.FlushAll(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		life := intervals.New(time.Millisecond, remoteOf(b).plan.Rules).GenLife() // the store's layout
		time.Sleep(life - 100*time.Millisecond)
		if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed {
			t.Fatalf("first call = %+v, %v", res, err)
		}
		time.Sleep(200 * time.Millisecond) // past the generation's life after the FlushAll
		if res, err := b.Allow(ctx, "r", "c"); err != nil || res.Allowed {
			t.Fatalf("second call 200ms later = %+v, %v: want denied (limit 1 per second)", res, err)
		}
	})
}

// checkMembers checks that set holds n members, each small, and so is the
// set.
func checkMembers(t *testing.T, e *env, set string, n int) {
	t.Helper()
	ctx := context.Background()
	members, err := e.admin.ZRange(ctx, set, 0, -1).Result()
	if err != nil || len(members) != n {
		t.Fatalf("ZRANGE = %d members, %v; want %d", len(members), err, n)
	}
	for _, m := range members {
		if len(m) > 64 {
			t.Fatalf("a member of %d bytes: want at most 64", len(m))
		}
	}
	if e.mini != nil {
		return // no MEMORY USAGE
	}
	if usage, err := e.admin.MemoryUsage(ctx, set).Result(); err != nil || usage > 16<<10 {
		t.Errorf("MEMORY USAGE = %d, %v; want at most 16 KiB", usage, err)
	}
}

// A member of a per-resource set is bounded whatever the client's name: ten
// calls of weight 5 from a 1 MB name keep a small set, Flush of that name
// still removes its members (and those an older version wrote with the name
// whole), and keeps those of a client whose name is the digest's bytes.
func TestSortedSetMembersBounded(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the members of a set")
		b := e.bucket(t, PerResource(Per(100, time.Minute)))
		ctx := context.Background()
		long := strings.Repeat("n", 1<<20)
		sum := sha256.Sum256([]byte(long))
		lookalike := string(sum[:16]) // its encoding is the long name's digest, without the '~'
		for range 10 {
			mustAllowN(t, b, long, 5, true)
		}
		mustAllowN(t, b, lookalike, 3, true)
		held := e.keys(t)
		if len(held) != 1 {
			t.Fatalf("keys %q, want the resource's one set", held)
		}
		set := held[0]
		checkMembers(t, e, set, 53)
		// A member an older version wrote, the long name whole.
		old := keys.Encode(long) + ":old:0"
		if err := e.admin.ZAdd(ctx, set, redis.Z{Score: float64(time.Now().UnixMilli()), Member: old}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.Flush(ctx, "r", long); err != nil {
			t.Fatal(err)
		}
		left, err := e.admin.ZRange(ctx, set, 0, -1).Result()
		if err != nil || len(left) != 3 {
			t.Fatalf("after Flush of the long name: %d members, %v; want the lookalike's 3", len(left), err)
		}
		for _, m := range left {
			if !strings.HasPrefix(m, keys.Encode(lookalike)+":") {
				t.Errorf("member %.40q left: want only the lookalike's", m)
			}
		}
	})
}
