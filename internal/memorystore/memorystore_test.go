package memorystore

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leakybucket/leakybucket/internal/intervals"
	"github.com/leakybucket/leakybucket/internal/limits"
)

// peekRules are a per-resource rule and two per-client ones, of which
// the 300 ms one counts in 50 ms intervals under FixedWindows: there, a
// sliding lane beside the fixed ones.
func peekRules(precision int64) []limits.Rule {
	return []limits.Rule{
		{Requests: 12, Window: 1500},
		{PerClient: true, Requests: 5, Window: 300, Precision: precision},
		{PerClient: true, Requests: 4, Window: 100},
	}
}

// peekConfig is the Config of rules counted as a strategy counts them:
// plain (Logs, and SortedSet without WithRecordDenied), capped (SortedSet
// with it), or in the intervals of a layout (Windows, FixedWindows).
func peekConfig(rules []limits.Rule, capped bool, layout *intervals.Layout) Config {
	cfg := Config{Rules: rules, Capped: capped, Layout: layout, MaxN: rules[0].Requests}
	for _, r := range rules {
		cfg.HasClientRule = cfg.HasClientRule || r.PerClient
		cfg.Longest = max(cfg.Longest, r.Window)
		cfg.MaxN = min(cfg.MaxN, r.Requests)
	}
	return cfg
}

// Peek copies only the oldest calls a judge can read, not a whole window:
// a Result judged from the copy, for every weight a Bucket accepts,
// admitted or denied and recorded, is the one judged from the scopes
// themselves, in every way of counting, after random calls that fill and
// overfill the rules (denied calls counted too, with recordDenied).
func TestPeekCopiesEnough(t *testing.T) {
	windows := intervals.New(time.Millisecond, peekRules(0))
	fixed := intervals.New(0, peekRules(50))
	modes := []struct {
		name         string
		cfg          Config
		recordDenied []bool
	}{
		{"plain", peekConfig(peekRules(0), false, nil), []bool{false, true}},
		{"capped", peekConfig(peekRules(0), true, nil), []bool{true}},
		{"windows", peekConfig(peekRules(0), false, &windows), []bool{false, true}},
		{"fixed windows", peekConfig(peekRules(50), false, &fixed), []bool{false, true}},
	}
	for i, m := range modes {
		for _, recordDenied := range m.recordDenied {
			t.Run(fmt.Sprintf("%s/recordDenied=%v", m.name, recordDenied), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					randomPeeks(t, New(m.cfg), recordDenied, uint64(i))
				})
			})
		}
	}
}

// randomPeeks makes 400 random calls on l, admitted when every rule has
// room (and recorded anyway if recordDenied), and compares Peek with the
// scopes after each.
func randomPeeks(t *testing.T, l *Counts, recordDenied bool, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 5))
	for i := range 400 {
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		client, n := fmt.Sprintf("c%d", rng.IntN(3)), 1+rng.IntN(4)
		l.Decide("r", client, n, func(v limits.View) bool {
			allowed := true
			for r, rule := range l.rules {
				allowed = allowed && rule.HasRoom(v.Counts[r].Used, n)
			}
			if !allowed {
				compareDenial(t, l, i, client, v, n, recordDenied)
			}
			return allowed || recordDenied
		})
		comparePeek(t, l, i, client)
		compareHeavyPeeks(t, l, i, client)
	}
}

// compareDenial fails if the view Decide gives a denied call of weight n
// by client answers otherwise than the whole counts, in how long until each rule
// has room for it (counted itself if recorded): a denial reads only the
// oldest calls its Result needs. It runs in evaluate, under the shard's
// lock, where sh.found and sh.from are the view's.
func compareDenial(t *testing.T, l *Counts, call int, client string, v limits.View, n int, recorded bool) {
	t.Helper()
	sh := l.shardOf(l.who("r", client))
	for i, rule := range l.rules {
		whole := v.Counts[i]
		whole.Oldest = entries(nil, sh.found[l.reads[i]].counted(sh.from[i]))
		if g, w := untilRoom(rule, v.Now, v.Counts[i], n, recorded), untilRoom(rule, v.Now, whole, n, recorded); g != w {
			t.Fatalf("call %d, rule %d, weight %d, recorded %v: room in %d ms from the denial's view, in %d ms from the whole count",
				call, i, n, recorded, g, w)
		}
	}
}

// wholeView is the view of a call by client, with every call each count
// holds in its Oldest: what Peek and a denial read a part of.
func wholeView(l *Counts, sh *shard, client string, now int64) limits.View {
	v := sh.view(l, l.who("r", client), now)
	for i := range l.rules {
		v.Counts[i].Oldest = entries(nil, sh.found[l.reads[i]].counted(sh.from[i]))
	}
	return v
}

// comparePeek fails if Peek's copy answers otherwise than the scopes
// themselves, read under the shard's lock: in what a Result says of each
// rule (Used, Newest, Stamp, the time), and in how long until a call of
// any weight fits, denied, or denied and recorded (counted itself, as a
// Result counts it).
func comparePeek(t *testing.T, l *Counts, call int, client string) {
	t.Helper()
	copied := l.Peek("r", client, 1)
	sh := l.shardOf(l.who("r", client))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	live := wholeView(l, sh, client, l.now())
	if copied.Now != live.Now {
		t.Fatalf("after call %d: peek's copy at %d, the scopes at %d", call, copied.Now, live.Now)
	}
	for i, rule := range l.rules {
		got, want := copied.Counts[i], live.Counts[i]
		if got.Used != want.Used || got.Newest != want.Newest || got.Stamp != want.Stamp {
			t.Fatalf("after call %d, rule %d: peek's copy counts %d, newest %d, stamp %d; the scopes %d, %d, %d",
				call, i, got.Used, got.Newest, got.Stamp, want.Used, want.Newest, want.Stamp)
		}
		for n := range l.maxN + 1 {
			for _, recorded := range []bool{false, true} {
				if g, w := untilRoom(rule, live.Now, got, n, recorded), untilRoom(rule, live.Now, want, n, recorded); g != w {
					t.Fatalf("after call %d, rule %d, weight %d, recorded %v: room in %d ms from peek's copy, in %d ms from the scopes",
						call, i, n, recorded, g, w)
				}
			}
		}
	}
}

// compareHeavyPeeks is comparePeek for the weights above maxN, which no
// Bucket admits and none records, but which a Result still judges by each
// rule that could ever hold them (the others say Never): Peek of such a
// weight copies what those rules read for it.
func compareHeavyPeeks(t *testing.T, l *Counts, call int, client string) {
	t.Helper()
	largest := 0
	for _, rule := range l.rules {
		largest = max(largest, rule.Requests)
	}
	for n := l.maxN + 1; n <= largest+1; n++ {
		copied := l.Peek("r", client, n)
		sh := l.shardOf(l.who("r", client))
		sh.mu.Lock()
		live := wholeView(l, sh, client, copied.Now)
		for i, rule := range l.rules {
			if n > rule.Requests {
				continue
			}
			if g, w := untilRoom(rule, live.Now, copied.Counts[i], n, false), untilRoom(rule, live.Now, live.Counts[i], n, false); g != w {
				t.Errorf("after call %d, rule %d, weight %d: room in %d ms from peek's copy, in %d ms from the scopes", call, i, n, g, w)
			}
		}
		sh.mu.Unlock()
	}
}

// untilRoom is how long until a call of weight n fits rule, given c: a
// denied call's RetryAfter, with the call counted too if recorded.
func untilRoom(rule limits.Rule, now int64, c limits.Count, n int, recorded bool) int64 {
	if recorded {
		c.Oldest = append(c.Oldest[:len(c.Oldest):len(c.Oldest)], limits.Entry{At: c.Stamp, Weight: n})
		c.Used = limits.AddCapped(c.Used, n)
	}
	return rule.UntilRoom(c.Oldest, now, c.Used, n)
}

// A call does not move its scope in its shard's list; a sweep that finds
// it still in use moves it, once a window: a scope called all along is
// kept while a window counts its calls, and freed within two windows of
// its newest call, and the list stays in order. Here "a" is called every
// 100 ms for four windows beside a new client each time, then nobody
// calls, and every shard is swept in turn (Sweep) as time passes.
func TestSweepKeepsScopesInUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New(peekConfig([]limits.Rule{{PerClient: true, Requests: 1000, Window: 1000}}, false, nil))
		admit := func(limits.View) bool { return true }
		for i := range 40 {
			l.Decide("r", "a", 1, admit)
			l.Decide("r", fmt.Sprint("b", i), 1, admit)
			checkLists(t, l)
			time.Sleep(100 * time.Millisecond)
		}
		held := func() bool {
			for range SweepCycle {
				l.Sweep()
			}
			checkLists(t, l)
			return slices.Contains(l.Keys(), "r a")
		}
		// a's newest call was 100 ms ago, and the b's older.
		time.Sleep(899 * time.Millisecond)
		if !held() {
			t.Fatal("a's scope was freed while a window counts its newest call")
		}
		time.Sleep(1101 * time.Millisecond)
		if held() {
			t.Error("a's scope is held two windows after its newest call")
		}
		if keys := l.Keys(); len(keys) > 0 {
			t.Errorf("scopes held two windows after every call: %v", keys)
		}
	})
}

// checkLists fails unless each shard's list holds its scopes, in the order
// of when they were listed.
func checkLists(t *testing.T, l *Counts) {
	t.Helper()
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n, last := 0, int64(math.MinInt64)
		for s := sh.oldest; s != nil; s = s.next {
			if s.listed < last {
				t.Errorf("shard %d: %v listed at %d after one at %d", i, s.key, s.listed, last)
			}
			n, last = n+1, s.listed
		}
		if n != len(sh.scopes) {
			t.Errorf("shard %d: %d scopes in the list, %d in the map", i, n, len(sh.scopes))
		}
		sh.mu.Unlock()
	}
}
