package leakybucket

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A weight above a rule's Requests is a denial, not an error: RetryAfter
// Never, the rules that cannot hold it and those full for now in DeniedBy,
// and every other field as it stands, nothing counted. PeekN says the
// same; AllowN of a weight that fits is decided as before.
func TestNeverFits(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		total, each := Per(6, time.Second), Per(4, time.Second)
		b := e.bucket(t, PerResource(total), PerClient(each))
		byTotal, byClient := Rule{Limit: total}, Rule{PerClient: true, Limit: each}
		e.run(t, b, "r", []step{
			{0, "a", 3, false, want{true, 1, 0, time.Second, nil}},
			// 5 does not fit the total's 3 left, for now; nor the
			// client's rule, ever.
			{0, "a", 5, false, want{false, 1, Never, time.Second, []Rule{byTotal, byClient}}},
			{0, "a", 5, true, want{false, 1, Never, time.Second, []Rule{byTotal, byClient}}},
			{0, "b", 3, false, want{true, 0, 0, time.Second, nil}},
			// t=200: the total is full for 800ms more; the client's rule
			// still never holds 5.
			{200 * ms, "b", 5, false, want{false, 0, Never, 800 * ms, []Rule{byTotal, byClient}}},
			// 7 fits no rule: both say Never.
			{0, "c", 7, false, want{false, 0, Never, 800 * ms, []Rule{byTotal, byClient}}},
			// t=1000: everything left; the heavy calls counted nowhere.
			{800 * ms, "a", 4, false, want{true, 0, 0, time.Second, nil}},
			{0, "a", 5, false, want{false, 0, Never, time.Second, []Rule{byTotal, byClient}}},
		})
		// Each rule on its own, on windows of a minute that outlast the
		// test however loaded the machine: the total is full for now (its
		// wait), the client's rule can never hold 5; the counts as they
		// stand.
		slow := e.bucket(t, WithPrefix(e.prefix+":minute"), PerResource(Per(6, time.Minute)), PerClient(Per(4, time.Minute)))
		ctx := context.Background()
		if res, err := slow.AllowN(ctx, "r", "a", 4); err != nil || !res.Allowed {
			t.Fatalf("AllowN(4) = %+v, %v", res, err)
		}
		res, err := slow.AllowN(ctx, "r", "a", 5)
		if err != nil {
			t.Fatal(err)
		}
		got := res.Rules
		if len(got) != 2 || got[0].Used != 4 || got[0].Remaining != 2 || got[0].RetryAfter <= 0 || got[0].RetryAfter > time.Minute ||
			got[1].Used != 4 || got[1].Remaining != 0 || got[1].RetryAfter != Never || got[1].ResetAfter <= 0 || got[1].ResetAfter > time.Minute {
			t.Errorf("AllowN(5) by rule = %+v; want the total 4 used with a wait, the client's 4 used with RetryAfter Never", got)
		}
	})
}

// A weight no rule can hold writes nothing, under any strategy, even with
// WithRecordDenied: the keys, what each holds, and what every rule
// counts are the same after it.
func TestNeverWritesNothing(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, opts := range [][]Option{
			{PerResource(Per(10, time.Minute)), PerClient(Per(3, time.Minute))},
			{WithPrefix(e.prefix + ":recorded"), WithRecordDenied(), PerResource(Per(10, time.Minute)), PerClient(Per(3, time.Minute))},
		} {
			b := e.bucket(t, opts...)
			empty := e.contents(t) // the keys of the Bucket before, if any
			fresh, err := b.AllowN(ctx, "r", "a", 1000)
			if err != nil || fresh.Allowed || fresh.RetryAfter != Never || fresh.Remaining != 3 || fresh.ResetAfter != 0 || len(fresh.DeniedBy) != 2 {
				t.Fatalf("AllowN(1000) on nothing counted = %+v, %v; want denied, Never, 3 remaining, by both rules", fresh, err)
			}
			if after := e.contents(t); !maps.Equal(after, empty) {
				t.Fatalf("AllowN(1000) on nothing counted wrote: %v, then %v", empty, after)
			}
			for _, client := range []string{"a", "b"} {
				if res, err := b.AllowN(ctx, "r", client, 2); err != nil || !res.Allowed {
					t.Fatalf("AllowN(%s, 2) = %+v, %v", client, res, err)
				}
			}
			before, usage := e.contents(t), usageOf(t, b, "a")
			for _, n := range []int{4, 11, 1 << 62} {
				if res, err := b.AllowN(ctx, "r", "a", n); err != nil || res.Allowed || res.RetryAfter != Never {
					t.Errorf("AllowN(%d) = %+v, %v; want denied, Never", n, res, err)
				}
				if res, err := b.PeekN(ctx, "r", "a", n); err != nil || res.Allowed || res.RetryAfter != Never {
					t.Errorf("PeekN(%d) = %+v, %v; want denied, Never", n, res, err)
				}
			}
			if after := e.contents(t); !maps.Equal(before, after) {
				t.Errorf("heavy calls changed the counts:\nbefore %v\nafter  %v", before, after)
			}
			if after := usageOf(t, b, "a"); !slices.Equal(after, usage) {
				t.Errorf("heavy calls changed what the rules count: %v, then %v", usage, after)
			}
		}
	})
}

// usageOf returns what each rule counts for client at r.
func usageOf(t *testing.T, b *Bucket, client string) []int {
	t.Helper()
	rules, err := b.Usage(context.Background(), "r", client)
	if err != nil {
		t.Fatal(err)
	}
	used := make([]int, len(rules))
	for i, rr := range rules {
		used[i] = rr.Used
	}
	return used
}

// contents returns every count key under the test's prefix with how much
// it holds: a sorted set's members, the sum of a hash's fields, a log's
// presence (its name carries its weight). In process: the keys alone.
func (e *env) contents(t *testing.T) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	for _, key := range e.countKeys(t) {
		if e.local != nil {
			out[key] = ""
			continue
		}
		out[key] = holding(ctx, t, e.admin, key)
	}
	return out
}

// holding says how much key holds.
func holding(ctx context.Context, t *testing.T, rdb redis.UniversalClient, key string) string {
	t.Helper()
	kind, err := rdb.Type(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	switch kind {
	case "zset":
		return "zset " + strconv.FormatInt(rdb.ZCard(ctx, key).Val(), 10)
	case "hash":
		sum := 0
		for _, v := range rdb.HVals(ctx, key).Val() {
			n, _ := strconv.Atoi(v)
			sum += n
		}
		return "hash " + strconv.Itoa(sum)
	}
	return kind
}

// A call no wait admits leaves the client's lighter calls as they were:
// not answered from the denial cache (which keeps the Results of weight 1
// only), nor sent to only look by foresight (they cost the round trips
// of an uncontended decision, and write).
func TestNeverLeavesLighterCalls(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		limit := Per(2, time.Minute)
		b := e.bucket(t, WithScanCount(1<<20), PerClient(limit))
		deny := []Rule{{PerClient: true, Limit: limit}}
		e.run(t, b, "r", []step{
			{0, "z", 1, false, want{true, 1, 0, time.Minute, nil}}, // the first estimate of Redis's clock
			// The denial cache counts time only once the server's clock
			// was seen moving: hence the second.
			{time.Second, "a", 3, false, want{false, 2, Never, 0, deny}},
			{0, "a", 3, false, want{false, 2, Never, 0, deny}},
		})
		decision := int64(1)
		if _, ok := e.strategy.(logsStrategy); ok {
			decision = 2
		}
		var res Result
		var err error
		if trips := e.trips.count(func() { res, err = b.Allow(ctx, "r", "a") }); err != nil || !res.Allowed || res.Remaining != 1 {
			t.Fatalf("Allow after AllowN(3) = %+v, %v; want admitted, 1 left", res, err)
		} else if e.local == nil && trips != decision {
			t.Errorf("Allow after AllowN(3): %d round trips, want %d (an uncontended decision)", trips, decision)
		}
		if res, err := b.Allow(ctx, "r", "a"); err != nil || !res.Allowed || res.Remaining != 0 {
			t.Fatalf("second Allow = %+v, %v; want admitted, none left", res, err)
		}
		if got := e.countKeys(t); len(got) == 0 {
			t.Errorf("the admitted calls wrote nothing")
		}
		// Full now: a heavy call still says Never, with the counts of the
		// two calls; a call of weight 1 waits for them.
		if res, err := b.AllowN(ctx, "r", "a", 3); err != nil || res.RetryAfter != Never || res.Rules[0].Used != 2 {
			t.Errorf("AllowN(3) when full = %+v, %v; want Never, 2 used", res, err)
		}
		if res, err := b.Allow(ctx, "r", "a"); err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Errorf("Allow when full = %+v, %v; want denied with a wait", res, err)
		}
	})
}

// Tiers answer as their Buckets do: a heavy call is a denial by the
// tier's rules.
func TestTiersNever(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "Tiers are made on a Redis client")
		tiers, err := NewTiers(e.rdb, WithPrefix(e.prefix), WithStrategy(e.strategy))
		if err != nil {
			t.Fatal(err)
		}
		mustSet(t, tiers, "free", PerClient(PerMinute(10)))
		mustSet(t, tiers, "pro", PerClient(PerMinute(100)))
		ctx := context.Background()
		res, err := tiers.AllowN(ctx, "free", "r", "a", 50)
		free := Rule{PerClient: true, Limit: PerMinute(10)}
		if err != nil || res.Allowed || res.RetryAfter != Never || !slices.Equal(res.DeniedBy, []Rule{free}) || res.Remaining != 10 {
			t.Errorf("free AllowN(50) = %+v, %v; want denied by %v, Never, 10 left", res, err, free)
		}
		if res, err := tiers.AllowN(ctx, "pro", "r", "a", 50); err != nil || !res.Allowed || res.Remaining != 50 {
			t.Errorf("pro AllowN(50) = %+v, %v; want admitted, 50 left", res, err)
		}
		if _, err := tiers.AllowN(ctx, "gold", "r", "a", 50); !errors.Is(err, ErrUnknownTier) {
			t.Errorf("gold: %v, want ErrUnknownTier", err)
		}
	})
}

// The observer hears a heavy call as a denial, not an error.
func TestObserverNever(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		var heard decisions
		rule := Rule{PerClient: true, Limit: Per(5, time.Minute)}
		b := e.bucket(t, PerClient(rule.Limit), WithObserver(heard.observe))
		res, err := b.AllowN(context.Background(), "r", "c", 6)
		d := heard.last(t)
		want := Decision{Op: opAllow, Resource: "r", Client: "c", N: 6, DeniedBy: []Rule{rule}, Latency: d.Latency}
		if err != nil || res.RetryAfter != Never || !equalDecisions(d, want) {
			t.Errorf("AllowN(6) = %+v, %v; observed %+v, want %+v", res, err, d, want)
		}
	})
}
