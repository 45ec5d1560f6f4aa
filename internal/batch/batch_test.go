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

// group decides each call as its Req doubled, after d, recording the sizes
// of its batches.
type group struct {
	*Group[int, int, int]
	d       time.Duration
	mu      sync.Mutex
	batches []int
	idle    int
}

func newGroup(d time.Duration) *group {
	g := &group{d: d}
	g.Group = NewGroup(func(*Line[int, int, int]) { g.mu.Lock(); g.idle++; g.mu.Unlock() })
	return g
}

func (g *group) run(ctx context.Context, calls []*Call[int, int], l *Line[int, int, int]) error {
	time.Sleep(g.d)
	g.mu.Lock()
	g.batches = append(g.batches, len(calls))
	g.mu.Unlock()
	for _, c := range calls {
		g.Answer(c, 2*c.Req)
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
				res, err := g.Do("k", &Call[int, int]{Ctx: context.Background(), Req: i}, g.run)
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
		g := NewGroup[int, int, int](nil)
		run := func(_ context.Context, calls []*Call[int, int], _ *Line[int, int, int]) error {
			most.Store(max(most.Load(), running.Add(1)))
			time.Sleep(time.Millisecond)
			running.Add(-1)
			for _, c := range calls {
				g.Answer(c, c.Req)
			}
			return nil
		}
		other := func(_ context.Context, calls []*Call[int, int], _ *Line[int, int, int]) error {
			lines.Add(1)
			for _, c := range calls {
				g.Answer(c, c.Req)
			}
			return nil
		}
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Go(func() {
				time.Sleep(time.Duration(i%7) * 300 * time.Microsecond)
				if _, err := g.Do("k", &Call[int, int]{Ctx: context.Background(), Req: i}, run); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Go(func() {
			time.Sleep(500 * time.Microsecond) // while a batch of "k" runs
			if _, err := g.Do("other", &Call[int, int]{Ctx: context.Background(), Req: 1}, other); err != nil {
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
		g := NewGroup[int, int, int](nil)
		settled := make(chan bool, 1)
		run := func(ctx context.Context, calls []*Call[int, int], _ *Line[int, int, int]) error {
			time.Sleep(time.Second)
			settled <- g.Answer(calls[0], 1)
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := g.Do("k", &Call[int, int]{Ctx: ctx, Req: 1}, run)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 10*time.Millisecond {
			t.Fatalf("Do = %v after %v, want the deadline after 10ms", err, time.Since(start))
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
		g := NewGroup[int, int, int](nil)
		run := func(_ context.Context, calls []*Call[int, int], _ *Line[int, int, int]) error {
			if calls[0].Req == 1 {
				g.Fail(calls, boom)
				return nil
			}
			return boom
		}
		for _, req := range []int{1, 2} {
			if _, err := g.Do("k", &Call[int, int]{Ctx: context.Background(), Req: req}, run); !errors.Is(err, boom) {
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
