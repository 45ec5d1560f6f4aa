package leakybucket

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The adversary of a look that finds room: calls that this process's
// foresight saw no room for only look, and one that finds room is decided
// again, writing. When a whole batch of a hammering client's calls looks
// and finds room (another process flushed the client, or its oldest calls
// left the window, before this process saw it), deciding every one of them
// again writing would put the whole batch's weight in the resource's
// count, the client's room's worth admitted and the rest written only to
// be denied and taken back: until the take-back lands, every other client
// of the resource is counted that weight, and one near the resource's
// limit is denied for a hammer that cost it room (rule 2). The calls
// decided again must write no more than the room their looks found: the
// rest look again.
//
// Here a client at its own limit of 5 (PerClient(Per(5, ...))) beside
// PerResource(Per(10, ...)) is flushed by another process; then a batch of
// 10 of its calls, all looking, finds room for 5. Once they are decided
// again, the process's transactions are held, whatever they are (a
// take-back included), and another process reads the resource's count:
// it must hold the 5 admitted and the one other call, not the 5 denied.
func TestLookWithRoomWritesOnlyTheRoom(t *testing.T) {
	eachOf(t, []Strategy{SortedSet, Windows(10 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "a take-back pending in Redis is what is looked for")
		const clientLimit, resourceLimit, hammer = 5, 10, 10
		rules := []Option{PerResource(Per(resourceLimit, time.Minute)), PerClient(Per(clientLimit, time.Minute))}
		hold := &holdTakeBacks{firstHeld: make(chan struct{}), firstGo: make(chan struct{}), takingBack: make(chan struct{}), release: make(chan struct{})}
		e.addHook(hold)
		abuser, other := e.bucket(t, rules...), e.bucketOn(t, e.secondClient(t), rules...)
		mustAdmit(t, abuser, "r", "hot", clientLimit)
		if err := other.Flush(context.Background(), "r", "hot"); err != nil {
			t.Fatal(err)
		}
		// The abuser's next decision (of "first", a client of its own) is
		// held until the hammer's calls are queued behind it: they are
		// then one batch, which this process's foresight says to look.
		hold.armed.Store(true)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() { mustAdmit(t, abuser, "r", "first", 1) })
		<-hold.firstHeld
		for range hammer {
			wg.Go(func() {
				if res, err := allowBounded(abuser, 10*time.Second, "r", "hot", 1); err == nil && res.Allowed {
					admitted.Add(1)
				}
			})
		}
		settle(e)
		close(hold.firstGo)
		// Once every call is answered, or a take-back is under way (held:
		// a denied call's weight is then still counted), the other
		// process reads the resource's count.
		answered := make(chan struct{})
		go func() { wg.Wait(); close(answered) }()
		select {
		case <-answered:
		case <-hold.takingBack:
		}
		used := usedNow(t, other, "r", "polite", 0)
		close(hold.release)
		<-answered
		if got := admitted.Load(); got != clientLimit {
			t.Errorf("%d of the flushed client's %d calls admitted, want its limit, %d", got, hammer, clientLimit)
		}
		if used > clientLimit+1 {
			t.Errorf("once the abuser's calls were answered, its take-backs held, the resource counted %d, want at most %d: "+
				"the %d calls admitted and the other client's, not calls written only to be denied", used, clientLimit+1, clientLimit)
		}
	})
}

// holdTakeBacks, once armed, holds a Bucket's first decision until
// firstGo is closed, and every transaction that only takes weight back
// (SortedSet's ZREM, Windows' HINCRBY of minus a weight, not a settling's
// move) until release is closed; takingBack is closed when the first is.
type holdTakeBacks struct {
	armed, firstDone, tookBack atomic.Bool
	firstHeld, firstGo         chan struct{}
	takingBack, release        chan struct{}
}

func (h *holdTakeBacks) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdTakeBacks) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdTakeBacks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch {
		case !h.armed.Load():
		case decides(cmds) && h.firstDone.CompareAndSwap(false, true):
			close(h.firstHeld)
			<-h.firstGo
		case takesBack(cmds):
			if h.tookBack.CompareAndSwap(false, true) {
				close(h.takingBack)
			}
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// takesBack reports whether a pipeline only takes weight back: it removes
// members (ZREM), or lowers intervals (HINCRBY by a negative weight) and
// raises none, as a move would.
func takesBack(cmds []redis.Cmder) bool {
	lowers, raises := false, false
	for _, c := range cmds {
		args := c.Args()
		switch name := commandName(c); {
		case name == "zrem":
			return true
		case name == "hincrby" && len(args) == 4:
			n, _ := strconv.ParseInt(fmt.Sprint(args[3]), 10, 64)
			lowers, raises = lowers || n < 0, raises || n > 0
		}
	}
	return lowers && !raises
}
