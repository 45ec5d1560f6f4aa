package memorystore

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// decideTATs decides a call and reports whether every rule had room.
func decideTATs(t *TATs, rules []limits.Rule, resource, client string, n int) bool {
	admitted := false
	t.Decide(resource, client, n, func(v limits.View) bool {
		admitted = true
		for r, rule := range rules {
			admitted = admitted && rule.HasRoom(v.Counts[r].Used, n)
		}
		return admitted
	})
	return admitted
}

// A bucket of burst 3 draining 10 a second admits 3 at once, then one
// every 100ms; a denied call fills nothing.
func TestTATs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := []limits.Rule{{PerClient: true, Requests: 3, Rate: 10, Window: 1000}, {Requests: 100, Window: 1000}}
		tats := NewTATs(rules, false)
		for i, want := range []bool{true, true, true, false} {
			if got := decideTATs(tats, rules, "r", "a", 1); got != want {
				t.Fatalf("call %d: admitted %v, want %v", i, got, want)
			}
		}
		if v := tats.Peek("r", "a", 1); v.Counts[0].Used != 3 || v.Counts[1].Used != 3 {
			t.Errorf("Peek: used %d and %d, want 3 and 3 (the denied call filled nothing)", v.Counts[0].Used, v.Counts[1].Used)
		}
		time.Sleep(100 * time.Millisecond)
		if !decideTATs(tats, rules, "r", "a", 1) || decideTATs(tats, rules, "r", "a", 1) {
			t.Error("after 100ms: want one call admitted, then a denial")
		}
	})
}

// Flush empties the client's own buckets, FlushAll every one; a sweep
// drops the empty ones.
func TestTATsFlushAndSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rules := []limits.Rule{{PerClient: true, Requests: 3, Rate: 10, Window: 1000}, {Requests: 100, Window: 1000}}
		tats := NewTATs(rules, false)
		decideTATs(tats, rules, "r", "a", 1)
		tats.Flush("r", "a")
		if v := tats.Peek("r", "a", 1); v.Counts[0].Used != 0 || v.Counts[1].Used == 0 {
			t.Errorf("after Flush: used %d and %d, want the client's empty and the resource's not", v.Counts[0].Used, v.Counts[1].Used)
		}
		tats.FlushAll("r")
		if keys := tats.Keys(); len(keys) != 0 {
			t.Errorf("after FlushAll: %q", keys)
		}
		decideTATs(tats, rules, "r", "b", 1)
		time.Sleep(time.Second)
		for range shardCount * tatSweepEvery {
			tats.Sweep()
		}
		if keys := tats.Keys(); len(keys) != 0 {
			t.Errorf("a second after the last call, every shard swept: %q", keys)
		}
	})
}
