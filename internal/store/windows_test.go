package store

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// A call whose estimate of Redis time was still in the last fixed window
// when Redis ran its transaction in the next was added to the last one's
// interval: it is evaluated with the calls of that window, not the next's.
func TestFixedWindowCountsAtTheEstimate(t *testing.T) {
	rule := limits.Rule{PerClient: true, Requests: 3, Window: 1000}
	s := NewWindows(Plan{Rules: []limits.Rule{rule}, Longest: rule.Window}, 0).(windowsStore)
	// The estimate is 999 (window 0, which held 3 calls before this
	// one's); Redis ran it at 1000 (window 1, empty).
	h := s.newHash("h", false, 999, around)
	h.whole = true
	h.parts[0].reads[1], h.parts[0].kinds[1] = 0, readWhole
	s.readAt(h, []any{map[any]any{"0": "4"}}, func(int) int64 { return 999 })
	h.parts[0].current -= 1
	c := s.count(h, 0, rule, 999, 1000)
	if c.Used != 3 || c.Stamp != 0 {
		t.Errorf("count = used %d, stamp %d; want the 3 of window 0, stamped 0", c.Used, c.Stamp)
	}
}

// A read of a hash counts each interval with what the hash's pending
// fields add to it (written by resent take-backs and moves: see
// txn.Txn.Resend): the current one, the others in their lanes, dropped at
// no weight, added if they held none; what is not a pending weight of
// ours is skipped. So does Flush's share.
func TestReadLessPending(t *testing.T) {
	rule := limits.Rule{Requests: 100, Window: 60_000}
	s := NewWindows(Plan{Rules: []limits.Rule{rule}, Longest: rule.Window}, time.Second).(windowsStore)
	const now = 1_700_000_000_000 // interval 20 of its epoch
	fields := map[any]any{
		"18": "5", "19": "3", "20": "4", "17": "2", "t": "14",
		"p:abc.0": "18:-2,20:-1,16:4",
		"p:def.1": "19:-9,x:1,18:0,17,:3,99:-1",
	}
	h := s.newHash("h", false, now, func(int) int64 { return 0 })
	h.whole = true
	h.parts[0].reads[1], h.parts[0].kinds[1] = 0, readWhole
	s.readAt(h, []any{fields}, func(int) int64 { return now })
	want := []limits.Entry{{ID: "16", At: s.Lanes[0].At(now/1000 - 4), Weight: 4}, {ID: "17", At: s.Lanes[0].At(now/1000 - 3), Weight: 2}, {ID: "18", At: s.Lanes[0].At(now/1000 - 2), Weight: 3}}
	if p := h.parts[0]; p.current != 3 || p.totals[1] != 14 || !slices.Equal(h.lanes[0], want) {
		t.Errorf("read current %d, total %d, lane %v; want 3, 14, %v", p.current, p.totals[1], h.lanes[0], want)
	}
	wantHeld := map[string]int{"16": 4, "17": 2, "18": 3, "19": -6, "20": 3, "99": -1, "t": 14}
	if got := held(fields); !maps.Equal(got, wantHeld) {
		t.Errorf("held = %v, want %v", got, wantHeld)
	}
}

// A batch that Redis ran in a later interval than its stamp's (of the
// same epoch, or the next) has its weight moved there before its calls
// are evaluated (early), and the take-back of those then denied comes from
// there: a batch whose every call is denied leaves every interval and
// total, the client's and the resource's, as it found them.
func TestMovedWeightTakenBackWhereItLies(t *testing.T) {
	rules := []limits.Rule{{Requests: 10, Window: 1000}, {PerClient: true, Requests: 3, Window: 1000}}
	s := NewWindows(Plan{Rules: rules, HasClientRule: true, Longest: 1000}, 100*time.Millisecond).(windowsStore)
	ks := keys.Of("lb:t", "r")
	start := 1000 * s.Epochs[0] // an epoch's first millisecond
	for _, c := range []struct {
		name      string
		stamp, at int64
	}{
		{"the same epoch", start + 150, start + 210},
		{"the next epoch", start + s.Epochs[0] - 20, start + s.Epochs[0] + 10},
	} {
		b := s.newBatch(ks, c.stamp, []limits.Call{{Client: "c", N: 2}, {Client: "d", N: 1}})
		write := txn.New(ks, false)
		b.queue(write)
		fix := b.early(make([]any, len(write.Cmds)), c.at) // no hash held an incarnation
		if fix == nil {
			t.Fatalf("%s: nothing moved", c.name)
		}
		b.landed()
		moved := hincrbys(map[string]int{}, write.Cmds, fix.Cmds)
		for _, g := range fix.Guards {
			moved = hincrbys(moved, g.Cmds)
		}
		for _, h := range b.order {
			if key, field, _ := b.home(h, 0); moved[fmt.Sprint(key, " ", field)] != h.added {
				t.Errorf("%s: %d moved to %s %v, want the %d written", c.name, moved[fmt.Sprint(key, " ", field)], key, field, h.added)
			}
		}
		back := txn.New(ks, true)
		b.queueBack(back, func(h *hash) int { return h.added })
		left := hincrbys(moved, back.Cmds)
		for _, g := range back.Guards {
			left = hincrbys(left, g.Cmds)
		}
		for field, n := range left {
			if n != 0 {
				t.Errorf("%s: written, moved and taken back, %s holds %d, want 0", c.name, field, n)
			}
		}
	}
}

// hincrbys adds to sums, by key and field, what the HINCRBYs of cmds add.
func hincrbys(sums map[string]int, cmds ...[][]any) map[string]int {
	out := maps.Clone(sums)
	for _, list := range cmds {
		for _, c := range list {
			if c[0] == "hincrby" {
				n, _ := c[3].(int)
				out[fmt.Sprint(c[1], " ", c[2])] += n
			}
		}
	}
	return out
}
