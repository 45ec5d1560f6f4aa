package intervals

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/limits"
)

const minute = int64(60_000)

// A Bucket of one precision keeps the key layout it had before rules had
// precisions; several lanes tag apart, and lanes of one span share it.
func TestLayoutTag(t *testing.T) {
	one := New(time.Second, []limits.Rule{{PerClient: true, Requests: 1, Window: minute}, {Requests: 5, Window: 60 * minute}})
	if got := one.Tag(); got != "w3600000p1000" {
		t.Errorf("tag of one precision = %q, want w3600000p1000", got)
	}
	y := mixedLayout()
	if got, want := y.Tag(), "w1800000p60000w3600000p1800000w1800000f1800000"; got != want {
		t.Errorf("tag = %q, want %q", got, want)
	}
	if !slices.Equal(y.Spans, []int64{60000, 1800000}) || len(y.LanesOf[1]) != 2 {
		t.Errorf("spans %v, lanes %v: want the minute, then the fixed and the sliding 30m in one span", y.Spans, y.LanesOf)
	}
	rules := slices.Clone(mixedRules)
	slices.Reverse(rules)
	if got := New(0, rules).Tag(); got != y.Tag() {
		t.Errorf("tag of the rules reversed = %q, want %q: reordering rules must keep the keys", got, y.Tag())
	}
}

// An epoch's hash outlives every interval a rule counts of a call stamped
// in it, and no more than an epoch and a window beyond the call (a fixed
// window: clock.LagLimit beyond its end, for a decision whose stamp trails
// Redis's time). Every writer of the epoch gives it the same deadline.
func TestEpochExpiry(t *testing.T) {
	y := mixedLayout()
	for _, now := range []int64{30*60_000 - 1, 30 * 60_000, 17, 95*60_000 + 3} {
		for g := range y.Spans {
			e := y.Epoch(g, now)
			at := y.EpochExpireAt(g, e)
			for _, l := range y.LanesOf[g] {
				if counted := y.Lanes[l].ExpireAt(now); at < counted {
					t.Errorf("EpochExpireAt(%d, %d) = %d: lane %+v counts a call at %d until %d", g, e, at, y.Lanes[l], now, counted)
				}
			}
			if most := now + y.Epochs[g] + 60*minute + clock.LagLimit.Milliseconds(); at > most {
				t.Errorf("EpochExpireAt(%d, %d) = %d: more than an epoch and the window after %d, %d", g, e, at, now, most)
			}
			if other := y.EpochExpireAt(g, y.Epoch(g, e*y.Epochs[g])); other != at {
				t.Errorf("epoch %d of span %d: deadline %d from its start, %d from %d", e, g, other, at, now)
			}
		}
	}
	if !slices.Equal(y.Epochs, []int64{30 * minute, 60 * minute}) {
		t.Errorf("epochs %v: want the longest window of each span, in whole intervals", y.Epochs)
	}
	fixed := New(0, []limits.Rule{{Requests: 1, Window: minute}})
	if got, want := fixed.EpochExpireAt(0, fixed.Epoch(0, 61_000)), 120_000+clock.LagLimit.Milliseconds(); got != want {
		t.Errorf("fixed EpochExpireAt = %d, want the window's end and clock.LagLimit, %d", got, want)
	}
	if odd := New(7*time.Millisecond, []limits.Rule{{Requests: 1, Window: 100}}); odd.Epochs[0] != 105 {
		t.Errorf("epoch of a 100 ms window at 7 ms = %d, want 105: whole intervals", odd.Epochs[0])
	}
}

// mixedRules are a notification sender's (all event types together at
// most 100 per 30 min, each type at most 10), with an hourly rule at a
// precision of the fixed window's length.
var mixedRules = []limits.Rule{
	{Requests: 100, Window: 30 * minute},
	{PerClient: true, Requests: 10, Window: 30 * minute, Precision: minute},
	{PerClient: true, Requests: 5, Window: 60 * minute, Precision: 30 * minute},
}

// mixedLayout is mixedRules' layout under FixedWindows.
func mixedLayout() Layout { return New(0, mixedRules) }

// An interval's field is its offset in its epoch, read back as the
// interval; a field that names no interval of the epoch is not ours.
func TestLayoutFields(t *testing.T) {
	y := mixedLayout()
	for g, span := range y.Spans {
		for _, index := range []int64{0, 42, 7777} {
			at := index * span
			e := y.Epoch(g, at)
			field := fmt.Sprint(y.Current(g, at))
			if got, ok := y.Interval(g, e, field); !ok || got != index {
				t.Errorf("span %d: interval(%q) in epoch %d = %d, %v; want %d", span, field, e, got, ok, index)
			}
		}
		for _, field := range []string{"x", "7:1", "-1", "", strconv.FormatInt(y.Epochs[g]/span, 10), "i", "t"} {
			if _, ok := y.Interval(g, 3, field); ok {
				t.Errorf("interval(%q) ok, want a field not ours", field)
			}
		}
	}
}
