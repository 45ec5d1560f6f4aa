package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// A client's counts follow it across tiers, and across a change of its
// tier's limit at run time, under Logs and Windows, whose keys carry no
// Requests; under SortedSet, whose sets are named by their Requests, a
// tier with other Requests starts from zero. On the real Redis: the
// minute-long windows outlast the test however loaded the machine is.
func TestTiersKeepCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy Strategy
		kept     bool // counts follow the client across Requests
	}{{Logs, true}, {Windows(time.Second), true}, {SortedSet, false}} {
		t.Run(tc.strategy.String(), func(t *testing.T) {
			t.Parallel()
			e := newRealEnv(t, strategyOf(tc.strategy))
			tiersKeepCounts(t, e, tc.strategy, tc.kept)
		})
	}
}

// strategyOf is the strategy whose ACL user may send what s sends.
func strategyOf(s Strategy) Strategy {
	if _, ok := s.(windowsStrategy); ok {
		return Windows(time.Millisecond)
	}
	return s
}

func tiersKeepCounts(t *testing.T, e *env, s Strategy, kept bool) {
	ctx := context.Background()
	tiers, err := NewTiers(e.rdb, WithPrefix(e.prefix), WithStrategy(s))
	if err != nil {
		t.Fatal(err)
	}
	mustSet(t, tiers, "free", PerClient(PerMinute(10)))
	mustSet(t, tiers, "pro", PerClient(PerMinute(100)))
	for i := range 8 {
		mustAllow(t, tiers, "free", true, 10-1-i)
	}
	// The client upgrades: pro counts its 8 calls, or starts afresh.
	want := 100 - 9
	if !kept {
		want = 100 - 1
	}
	mustAllow(t, tiers, "pro", true, want)
	// Free's limit is lowered at run time below what the client used.
	old, _ := tiers.Bucket("free")
	mustSet(t, tiers, "free", PerClient(PerMinute(5)))
	if now, _ := tiers.Bucket("free"); now == old {
		t.Fatal("Set kept the old Bucket")
	}
	if kept {
		mustAllow(t, tiers, "free", false, 0)
	} else {
		mustAllow(t, tiers, "free", true, 4)
	}
	if _, err := tiers.Allow(ctx, "gold", "GET /", "c"); !errors.Is(err, ErrUnknownTier) {
		t.Errorf("Allow of an unknown tier: err = %v, want ErrUnknownTier", err)
	}
}

func mustSet(t *testing.T, tiers *Tiers, tier string, rules ...Option) {
	t.Helper()
	if err := tiers.Set(tier, rules...); err != nil {
		t.Fatal(err)
	}
}

// mustAllow makes one call of client "c" to "GET /" in tier and checks the
// answer.
func mustAllow(t *testing.T, tiers *Tiers, tier string, allowed bool, remaining int) {
	t.Helper()
	res, err := tiers.Allow(context.Background(), tier, "GET /", "c")
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed != allowed || res.Remaining != remaining {
		t.Fatalf("Allow(tier %q) = allowed %v, remaining %d; want %v, %d", tier, res.Allowed, res.Remaining, allowed, remaining)
	}
}

// Set and Delete while calls run: no race, and every call finds a tier
// whose rules were Set.
func TestTiersSetWhileServing(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		tiers, err := NewTiers(e.rdb, WithPrefix(e.prefix))
		if err != nil {
			t.Fatal(err)
		}
		mustSet(t, tiers, "free", PerClient(PerMinute(1000)))
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 20 {
					if _, err := tiers.Allow(context.Background(), "free", "GET /", "c"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		for i := range 20 {
			mustSet(t, tiers, "free", PerClient(PerMinute(1000+i)))
			tiers.Delete("other")
		}
		wg.Wait()
		if got := tiers.Names(); len(got) != 1 || got[0] != "free" {
			t.Errorf("Names() = %v, want [free]", got)
		}
	})
}

// Bad input is refused with matchable errors, nothing panics.
func TestTiersInvalid(t *testing.T) {
	t.Parallel()
	if _, err := NewTiers(nil); !errors.Is(err, ErrUnsupportedClient) {
		t.Errorf("NewTiers(nil): err = %v, want ErrUnsupportedClient", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: New sends nothing
	defer rdb.Close()
	tiers, err := NewTiers(rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := tiers.Set("", PerClient(PerMinute(1))); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("Set(\"\"): err = %v, want ErrInvalidOption", err)
	}
	if err := tiers.Set("free"); !errors.Is(err, ErrInvalidOption) || !strings.Contains(fmt.Sprint(err), "no rule") {
		t.Errorf("Set without rules: err = %v, want ErrInvalidOption saying there is no rule", err)
	}
	if _, ok := tiers.Bucket("free"); ok {
		t.Error("a failed Set added the tier")
	}
}
