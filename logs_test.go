package leakybucket

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// Whatever the input, AllowN answers or returns an error; it never panics,
// and with an error it writes nothing. A weight above a rule's Requests is
// a denial with RetryAfter Never, which writes nothing either.
func FuzzAllowInput(f *testing.F) {
	f.Add("r", "a", 1)
	f.Add("", "a", 1)
	f.Add("r", "", 1)
	f.Add("{r}", "*", 3)
	f.Add("r", "a", 0)
	f.Add("r", "a", -1)
	f.Add("r", "a", 1<<62)
	m := miniredis.RunT(f)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	f.Cleanup(func() { rdb.Close() })
	b, err := New(rdb, PerResource(Per(10, time.Minute)), PerClient(Per(3, time.Minute)))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, resource, client string, n int) {
		m.FlushAll()
		res, err := b.AllowN(context.Background(), resource, client, n)
		valid := resource != "" && client != "" && n >= 1
		if (err == nil) != valid {
			t.Fatalf("AllowN(%q, %q, %d) error = %v, want error: %v", resource, client, n, err, !valid)
		}
		if keys := m.Keys(); (!valid || n > 3) && len(keys) != 0 {
			t.Fatalf("AllowN(%q, %q, %d) = %+v, %v, yet wrote %q", resource, client, n, res, err, keys)
		}
		if !valid {
			return
		}
		if n > 3 {
			// Above the per-client 3 (and maybe the per-resource 10): a
			// denial no wait lifts, of the rules that cannot hold it.
			never := []Rule{{PerClient: true, Limit: Per(3, time.Minute)}}
			if n > 10 {
				never = append([]Rule{{Limit: Per(10, time.Minute)}}, never...)
			}
			if res.Allowed || res.RetryAfter != Never || res.Remaining != 3 || res.ResetAfter != 0 || !slices.Equal(res.DeniedBy, never) {
				t.Fatalf("AllowN(%q, %q, %d) = %+v, want denied by %v, RetryAfter Never, 3 remaining", resource, client, n, res, never)
			}
			return
		}
		held := m.Keys()
		if !res.Allowed || res.Remaining != 3-n || len(held) != 1 {
			t.Fatalf("AllowN(%q, %q, %d) = %+v with keys %q, want admitted, one log", resource, client, n, res, held)
		}
		if l, ok := keys.ParseLog(held[0], remoteOf(b).keysOf(resource).Logs()); !ok || l.Client != keys.Encode(client) || l.Weight != n {
			t.Fatalf("log %q does not name (%q, %q, %d)", held[0], resource, client, n)
		}
	})
}

// duplicateScans makes every SCAN page return each key twice, as SCAN may.
type duplicateScans struct{}

func (duplicateScans) DialHook(next redis.DialHook) redis.DialHook { return next }

func (duplicateScans) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (duplicateScans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if scan, ok := cmd.(*redis.ScanCmd); ok {
				keys, cursor := scan.Val()
				scan.SetVal(append(keys, keys...), cursor)
			}
		}
		return err
	}
}

func TestScanDuplicatesCountOnce(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "SCAN")
		e.addHook(duplicateScans{})
		b := e.bucket(t, PerResource(Per(4, time.Minute)))
		deny := []Rule{{Limit: Per(4, time.Minute)}}
		e.run(t, b, "r", []step{
			{0, "a", 2, false, want{true, 2, 0, time.Minute, nil}},
			{0, "b", 1, false, want{true, 1, 0, time.Minute, nil}},
			{0, "c", 1, true, want{true, 0, 0, time.Minute, nil}},
			{0, "c", 2, false, want{false, 1, time.Minute, time.Minute, deny}},
		})
	})
}

// SCAN paging, on the real Redis only (miniredis ignores COUNT): more logs
// than COUNT among thousands of unrelated keys are counted exactly.
//
// A decision here walks the whole shared database 10 keys a page, hundreds
// of round trips under its lock, which a loaded machine can stretch past
// the 2s default lock TTL: the lock TTL is not what this tests, so it is a
// minute.
func TestScanPaging(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, Logs)
	e.fillUnrelated(t, 3000)
	ctx := context.Background()
	const limit = 40
	b := e.bucket(t, WithScanCount(10), WithLockTTL(time.Minute), PerResource(Per(limit, time.Minute)), PerClient(Per(limit, time.Minute)))
	for i := range limit - 1 {
		if res, err := b.Allow(ctx, "r", "a"); err != nil || !res.Allowed || res.Remaining != limit-1-i {
			t.Fatalf("Allow #%d = %+v, %v; want admitted with %d left", i+1, res, err, limit-1-i)
		}
	}
	var res Result
	var err error
	if trips := e.trips.count(func() { res, err = b.Allow(ctx, "r", "a") }); trips < 100 {
		t.Errorf("a decision with COUNT 10 over 3000+ keys took %d round trips; SCAN did not page", trips)
	}
	if err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("Allow #%d = %+v, %v; want admitted with 0 left", limit, res, err)
	}
	for _, client := range []string{"a", "b"} {
		if res, err := b.Allow(ctx, "r", client); err != nil || res.Allowed {
			t.Errorf("Allow(%s) past the limit = %+v, %v; want denied", client, res, err)
		}
	}
	if err := b.FlushAll(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Peek(ctx, "r", "a"); err != nil || res.Remaining != limit-1 {
		t.Errorf("Peek after FlushAll over many pages = %+v, %v; want %d left", res, err, limit-1)
	}
}
