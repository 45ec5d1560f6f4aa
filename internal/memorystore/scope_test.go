package memorystore

import (
	"math"
	"testing"
	"unsafe"

	"github.com/leakybucket/leakybucket/internal/limits"
)

// A scope whose calls waver around a steady number, here irregularly and
// by a fifth either way over about two windows, allocates nothing once its
// room fits them: neither growing it (add) nor giving it back (dropped)
// leaves the calls at the edge of the other's threshold. (Giving it back
// at a quarter full to twice the calls, and growing it twice, allocated 26
// times in 20 windows.)
func TestScopeSteadyAllocatesNothing(t *testing.T) {
	const window = 1000 // ms
	s := &scope{}
	now := int64(0)
	windows := func(n int) {
		for range n * window {
			now++
			rate := 0.2 * (1 + 0.2*math.Sin(float64(now)/300)) // calls a ms
			if math.Mod(float64(now)*rate, 1) < rate {
				s.trim(now, window)
				s.add(limits.Entry{At: now, Weight: 1}, false)
			}
		}
	}
	windows(3)
	if allocs := testing.AllocsPerRun(1, func() { windows(20) }); allocs != 0 {
		t.Errorf("%.0f allocations over 20 windows of 160-240 calls, want none", allocs)
	}
}

// A scope takes 192 bytes, its size class (above 176 and up to 192
// bytes), so that it starts on a cache line, and a decision reads only
// its first two lines (see scope).
func TestScopeLayout(t *testing.T) {
	var s scope
	if size := unsafe.Sizeof(s); size <= 176 || size > 192 {
		t.Errorf("a scope is %d bytes, want 177 to 192", size)
	}
	for name, offset := range map[string]uintptr{"calls": unsafe.Offsetof(s.calls), "head": unsafe.Offsetof(s.head),
		"oldest": unsafe.Offsetof(s.oldest), "total": unsafe.Offsetof(s.total), "newest": unsafe.Offsetof(s.newest),
		"written": unsafe.Offsetof(s.written), "named": unsafe.Offsetof(s.named)} {
		if offset >= 128 {
			t.Errorf("a scope's %s is at byte %d, past its first two cache lines", name, offset)
		}
	}
	if unsafe.Offsetof(s.calls)+unsafe.Sizeof(s.calls) > 64 {
		t.Error("a scope's key and calls are not in its first cache line")
	}
}
