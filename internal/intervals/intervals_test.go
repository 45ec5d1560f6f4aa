package intervals

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/limits"
)

const minute = int64(60_000)

// A Bucket of one precision keeps the key layout it had before rules had
// precisions, but for the coarse blocks (b16) that its windows of more than
// 16 intervals keep; several lanes tag apart, and lanes of one span share
// it.
func TestLayoutTag(t *testing.T) {
	one := New(time.Second, []limits.Rule{{PerClient: true, Requests: 1, Window: minute}, {Requests: 5, Window: 60 * minute}})
	if got := one.Tag(); got != "w3600000p1000b16" {
		t.Errorf("tag of one precision = %q, want w3600000p1000b16", got)
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

// A hash outlives every interval a rule counts of a call stamped now, and
// no more than one precision beyond its window (a fixed window: clock.LagLimit
// beyond it, for a decision whose stamp trails Redis's time).
func TestExpiryBounds(t *testing.T) {
	y := mixedLayout()
	for _, now := range []int64{30*60_000 - 1, 30 * 60_000, 17} {
		at := y.ExpireAt(now)
		for _, l := range y.Lanes {
			if counted := l.Stamp(now) + l.Longest; at < counted {
				t.Errorf("expireAt(%d) = %d: lane %+v counts the call until %d", now, at, l, counted)
			}
		}
		// The longest window is the hour's, at a precision of 30 minutes.
		if most := now + 60*minute + 30*minute; at > most {
			t.Errorf("expireAt(%d) = %d: more than a precision after the window, %d", now, at, most)
		}
	}
	fixed := New(0, []limits.Rule{{Requests: 1, Window: minute}})
	if got, want := fixed.ExpireAt(61_000), 120_000+clock.LagLimit.Milliseconds(); got != want {
		t.Errorf("fixed expireAt = %d, want the window's end and clock.LagLimit, %d", got, want)
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

// Every span names its fields apart, and reads back only its own.
func TestLayoutFields(t *testing.T) {
	y := mixedLayout()
	for g := range y.Spans {
		name := y.FieldName(g, 42)
		if got, index, ok := y.Interval(name); !ok || got != g || index != 42 {
			t.Errorf("interval(%q) = %d, %d, %v; want %d, 42", name, got, index, ok, g)
		}
		if fmt.Sprint(y.Current(g, 42*y.Spans[g])) != name {
			t.Errorf("current(%d) = %v, want %q", g, y.Current(g, 42*y.Spans[g]), name)
		}
	}
	for _, field := range []string{"x", "7:1", "60000:x", ""} {
		if _, _, ok := y.Interval(field); ok {
			t.Errorf("interval(%q) ok, want a field not ours", field)
		}
	}
}
