package batch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leakybucket/leakybucket/internal/lock"
)

// call is a call as a user of the package holds it: its request and its
// result beside the Call.
type call struct {
	Call
	req, res int
}

// run decides a batch, as a worker does: for each call, Answer and then
// its result, or Fail.
type run func(ctx context.Context, calls []*call, l *Line) error

// do is one caller's call to the line key, decided by run, as a user of
// the package makes it: Join, the worker started by the first caller of
// an idle line, which runs batches until the line is empty and then
// calls idle, and Wait.
func do(g *Group, key string, c *call, decide run, idle func()) (int, error) {
	l, first, err := g.Join(key, c)
	if err != nil {
		return 0, err
	}
	if first {
		go func() {
			for b := g.Next(l); b != nil; b = g.Next(l) {
				calls := make([]*call, len(b.Calls))
				for i, c := range b.Calls {
					calls[i] = c.(*call)
				}
				g.Finish(l, b, decide(b.Ctx, calls, l))
			}
			if idle != nil {
				idle()
			}
		}()
	}
	if err := g.Wait(l, c); err != nil {
		return 0, err
	}
	return c.res, nil
}

// answer gives c the result res if its caller waits for it.
func answer(g *Group, c *call, res int) bool {
	if !g.Answer(c) {
		return false
	}
	c.res = res
	return true
}

// group decides each call as its req doubled, after d, recording the sizes
// of its batches.
type group struct {
	*Group
	d       time.Duration
	mu      sync.Mutex
	batches []int
	idle    int
}

func newGroup(d time.Duration) *group { return &group{Group: NewGroup(), d: d} }

func (g *group) do(key string, c *call) (int, error) {
	return do(g.Group, key, c, g.run, func() { g.mu.Lock(); g.idle++; g.mu.Unlock() })
}

func (g *group) run(ctx context.Context, calls []*call, l *Line) error {
	time.Sleep(g.d)
	g.mu.Lock()
	g.batches = append(g.batches, len(calls))
	g.mu.Unlock()
	for _, c := range calls {
		answer(g.Group, c, 2*c.req)
	}
	return nil
}

// Calls that arrive while a batch runs are decided together in the next,
// each with its own result; the line goes idle once empty.
func TestCallsWaitingAreOneBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGroup(time.Millisecond)
		var wg sync.WaitGroup
		results := make([]int, 10)
		for i := range results {
			wg.Go(func() {
				res, err := g.do("k", &call{Call: Call{Ctx: context.Background()}, req: i})
				if err != nil {
					t.Error(err)
				}
				results[i] = res
			})
			if i == 0 {
				synctest.Wait() // the first batch starts alone
			}
		}
		wg.Wait()
		synctest.Wait()
		for i, r := range results {
			if r != 2*i {
				t.Errorf("call %d got %d, want %d", i, r, 2*i)
			}
		}
		if len(g.batches) != 2 || g.batches[0] != 1 || g.batches[1] != 9 || g.idle != 1 || g.Lines() != 0 {
			t.Errorf("batches %v, idle %d times, %d lines left; want [1 9], idle once, none left", g.batches, g.idle, g.Lines())
		}
	})
}

// A line decides one batch at a time, however its calls arrive: a batch
// that counted what another of its line wrote and then takes back would
// deny calls on weight never admitted. Other lines run beside it.
func TestOneBatchOfALineAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var running, most, lines atomic.Int64
		g := NewGroup()
		run := func(_ context.Context, calls []*call, _ *Line) error {
			most.Store(max(most.Load(), running.Add(1)))
			time.Sleep(time.Millisecond)
			running.Add(-1)
			for _, c := range calls {
				answer(g, c, c.req)
			}
			return nil
		}
		other := func(_ context.Context, calls []*call, _ *Line) error {
			lines.Add(1)
			for _, c := range calls {
				answer(g, c, c.req)
			}
			return nil
		}
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Go(func() {
				time.Sleep(time.Duration(i%7) * 300 * time.Microsecond)
				if _, err := do(g, "k", &call{Call: Call{Ctx: context.Background()}, req: i}, run, nil); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Go(func() {
			time.Sleep(500 * time.Microsecond) // while a batch of "k" runs
			if _, err := do(g, "other", &call{Call: Call{Ctx: context.Background()}, req: 1}, other, nil); err != nil {
				t.Error(err)
			}
			if running.Load() == 0 {
				t.Error("the other line waited for the batch of k")
			}
		})
		wg.Wait()
		if most.Load() != 1 || lines.Load() != 1 {
			t.Errorf("up to %d batches of one line ran at once, want 1; the other line ran %d batches, want 1", most.Load(), lines.Load())
		}
	})
}

// A caller whose context ends returns at once with its context's error,
// and its call is recorded nowhere: Answer reports that no one waits.
func TestAbandonedCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGroup()
		settled := make(chan bool, 1)
		run := func(ctx context.Context, calls []*call, _ *Line) error {
			time.Sleep(time.Second)
			settled <- answer(g, calls[0], 1)
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := do(g, "k", &call{Call: Call{Ctx: ctx}, req: 1}, run, nil)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 10*time.Millisecond {
			t.Fatalf("do = %v after %v, want the deadline after 10ms", err, time.Since(start))
		}
		if <-settled {
			t.Error("Answer of an abandoned call reported a caller waiting")
		}
	})
}

// Fail gives the calls an error; a failed batch gives every call its error.
func TestFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		g := NewGroup()
		run := func(_ context.Context, calls []*call, _ *Line) error {
			if calls[0].req == 1 {
				g.Fail(calls[0], boom)
				return nil
			}
			return boom
		}
		for _, req := range []int{1, 2} {
			if _, err := do(g, "k", &call{Call: Call{Ctx: context.Background()}, req: req}, run, nil); !errors.Is(err, boom) {
				t.Errorf("call %d: error %v, want boom", req, err)
			}
		}
	})
}

// A call that gives up while its line's lock is held elsewhere says so.
func TestGivenUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := GivenUp(ctx, true, nil); !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Errorf("GivenUp contended = %v, want ErrNotObtained and Canceled", err)
	}
	if err := GivenUp(ctx, false, nil); errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
		t.Errorf("GivenUp = %v, want Canceled alone", err)
	}
}
