package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// stallRounds is how many pairs of admissions TestStallBeforeSend and
// TestStallBeforeSendFixed check per strategy and lag.
const stallRounds = 10

// stallLags are the lags they put between stamping a decision and sending
// it: under a millisecond, one or two (a transaction Redis runs in a later
// millisecond than its stamp's), and tens (a GC pause, a starved CPU).
var stallLags = []time.Duration{500 * time.Microsecond, ms, 1500 * time.Microsecond, 2 * ms, 20 * ms, 40 * ms}

// A process that stalls between stamping a batch and sending it (here a
// hook that sleeps before MULTI, until the first call is admitted, and not
// after) never has two calls of Per(1, time.Second) admitted within one
// second of Redis's time: each call counts from no earlier than the
// transaction that recorded it. Each lag has a client, a hook and a
// Bucket of its own, and runs beside the others. The check allows 1 ms for
// Redis's clock, which the strategies read in whole milliseconds.
func TestStallBeforeSend(t *testing.T) {
	eachOf(t, []Strategy{Logs, SortedSet, Windows(50 * ms), Windows(ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the stall is a Redis client's hook")
		eachLag(t, e, PerClient(Per(1, time.Second)), func(round int, lag time.Duration, b *Bucket, hook *stallHook) error {
			// Each round stamps its first call at another point of an
			// interval, so that on fake time too some stalls cross into
			// the next one.
			time.Sleep(time.Duration(round*13%50) * ms)
			first, second, err := admitTwice(b, hook, fmt.Sprint("stall", lag, round))
			if err == nil && second.Sub(first) < time.Second-ms {
				err = fmt.Errorf("two calls admitted %v apart in Redis time, want at least 1s", second.Sub(first))
			}
			return err
		})
	})
}

// eachLag runs stallRounds rounds of round for each of stallLags, the lags
// side by side, each on a client of e's server with a stallHook of its own
// that stalls its decisions by the lag, and a Bucket of rule on it. A
// round's error fails the test, naming its lag and round.
func eachLag(t *testing.T, e *env, rule Option, round func(round int, lag time.Duration, b *Bucket, hook *stallHook) error) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []string
	)
	for _, lag := range stallLags {
		client, hook := e.secondClient(t), &stallHook{}
		addHookOn(client, hook)
		b := e.bucketOn(t, client, rule)
		wg.Go(func() {
			for r := range stallRounds {
				hook.stall.Store(int64(lag))
				if err := round(r, lag, b, hook); err != nil {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("a stall of %v, round %d: %v", lag, r, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, f := range failed {
		t.Error(f)
	}
}

// Under FixedWindows a call counts in the window of its stamp, unless
// Redis ran it in the next: then the decision is made again, in the next.
// So a stall across a window's start never has two calls of Per(1,
// 250ms) admitted in one fixed window of Redis's time, but for a call
// that ran in its first millisecond (1 ms for Redis's clock, read in whole
// milliseconds).
func TestStallBeforeSendFixed(t *testing.T) {
	eachOf(t, []Strategy{FixedWindows}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the stall is a Redis client's hook")
		const window = 250 * ms
		eachLag(t, e, PerClient(Per(1, window)), func(round int, lag time.Duration, b *Bucket, hook *stallHook) error {
			resource := fmt.Sprint("stall", lag, round)
			hook.stall.Store(0)
			if _, err := b.Peek(context.Background(), resource, "c"); err != nil { // the first estimate of Redis's clock
				return err
			}
			// Stamped half the stall before a window starts, run after.
			time.Sleep(time.Until(time.Now().Truncate(window).Add(window - lag/2)))
			hook.stall.Store(int64(lag))
			first, second, err := admitTwice(b, hook, resource)
			if err == nil && first.UnixMilli()/window.Milliseconds() == second.UnixMilli()/window.Milliseconds() && first.UnixMilli()%window.Milliseconds() > 1 {
				err = fmt.Errorf("two calls admitted at %v and %v of Redis time, in one fixed window of %v", first, second, window)
			}
			return err
		})
	})
}

// admitTwice calls b until two calls of resource are admitted, and returns
// the Redis time of the decision of each.
func admitTwice(b *Bucket, hook *stallHook, resource string) (first, second time.Time, err error) {
	var at []time.Time
	for range 2000 {
		res, err := b.Allow(context.Background(), resource, "c")
		if err != nil {
			return first, second, err
		}
		if res.Allowed {
			hook.stall.Store(0) // the next admission's decision is not late
			if at = append(at, hook.latest()); len(at) == 2 {
				return at[0], at[1], nil
			}
		}
		time.Sleep(5 * ms)
	}
	return first, second, fmt.Errorf("%d admissions in 2000 calls, want 2", len(at))
}

// stallHook sleeps for stall before each transaction it sends, or until
// Redis's estimated time is until, and keeps the latest Redis time any
// reply of TIME carried but a re-scoring's.
type stallHook struct {
	stall atomic.Int64 // a time.Duration
	until atomic.Int64 // Redis's time, in Unix ns, or 0
	mu    sync.Mutex
	last  time.Time
	at    time.Time // when last arrived, by this host's clock
}

// wait sleeps until Redis's estimated time is until, if it is set: to
// within a fraction of a millisecond, spinning at the end, as a sleep may
// wake a millisecond late. On fake time, which moves only when every
// goroutine waits, the spin gives up and the sleep lands on time.
func (h *stallHook) wait() {
	until := h.until.Load()
	if until == 0 {
		return
	}
	left := func() time.Duration { return time.Unix(0, until).Sub(h.redisNow()) }
	time.Sleep(left() - ms)
	for spins := 0; spins < 1e6 && left() > 0; spins++ {
	}
	time.Sleep(left())
}

// redisNow estimates Redis's time now from the latest TIME seen.
func (h *stallHook) redisNow() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last.Add(time.Since(h.at))
}

func (h *stallHook) latest() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

func (h *stallHook) saw(v any) {
	at, ok := txn.ReplyTime(v)
	if tc, isTime := v.(time.Time); isTime {
		at, ok = tc, true
	}
	if ok {
		h.mu.Lock()
		h.last, h.at = at, time.Now()
		h.mu.Unlock()
	}
}

func (h *stallHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *stallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && commandName(cmd) == "time" {
			h.sawReply(cmd)
		}
		return err
	}
}

func (h *stallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		inTxn := len(cmds) > 1 && commandName(cmds[0]) == "multi"
		if inTxn {
			time.Sleep(time.Duration(h.stall.Load()))
			h.wait()
		}
		err := next(ctx, cmds)
		if restampOnly(cmds) || moveOnly(cmds) {
			// Settling a call decided already (SortedSet scoring its
			// members again, Windows moving its weight): this TIME is
			// later than the call's.
			return err
		}
		for i, cmd := range cmds {
			if commandName(cmd) != "time" {
				continue
			}
			h.sawReply(cmd) // sent alone, or in a transaction that sets it (TxPipelined)
			if exec, ok := cmds[len(cmds)-1].(*redis.Cmd); ok && inTxn {
				// Sent with Do: its reply is among EXEC's, after MULTI's.
				if replies, ok := exec.Val().([]any); ok && i-1 < len(replies) {
					h.saw(replies[i-1])
				}
			}
		}
		return err
	}
}

// sawReply keeps the time a TIME command read, sent alone or pipelined.
func (h *stallHook) sawReply(cmd redis.Cmder) {
	switch c := cmd.(type) {
	case *redis.TimeCmd:
		if c.Err() == nil {
			h.saw(c.Val())
		}
	case *redis.Cmd:
		if c.Err() == nil {
			h.saw(c.Val())
		}
	}
}

// A stall that ends just past the end of the stamp's interval (under
// SortedSet, its millisecond), so that Redis runs the transaction in the
// first millisecond of the next one,
// still counts the call from no earlier than the millisecond Redis ran it
// in: a call of Per(1, time.Second) that Redis runs 999 ms after it, in
// Redis's clock in whole milliseconds (as the strategies read it), is
// denied, and none is admitted until 1000 ms after it.
func TestStallToTheNextInterval(t *testing.T) {
	eachOf(t, []Strategy{Windows(50 * ms), Windows(10 * ms), SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the stall is a Redis client's hook")
		hook := &stallHook{}
		e.addHook(hook)
		precision := ms // SortedSet scores a call by the millisecond
		if w, ok := e.strategy.(windowsStrategy); ok {
			precision = w.precision
		}
		for round := range stallRounds {
			b := e.bucket(t, PerClient(Per(1, time.Second)))
			resource := fmt.Sprint("boundary", round)
			if _, err := b.Peek(context.Background(), resource, "c"); err != nil { // the first estimate of Redis's clock
				t.Fatal(err)
			}
			// Stall until just after the next interval starts, as Redis's
			// clock is estimated from its latest TIME (the transaction
			// then takes its way to Redis, a fraction of a millisecond).
			next := hook.redisNow().Truncate(precision).Add(precision)
			first := allowAt(t, b, hook, resource, next.Add(300*time.Microsecond))
			if !first.Allowed {
				t.Fatalf("round %d: the first call = %+v; want it admitted", round, first)
			}
			at := hook.latest()
			// Then a call that Redis runs in the millisecond 999 ms after the
			// first one's, and calls until one is admitted.
			probe := allowAt(t, b, hook, resource, at.Truncate(ms).Add(time.Second-ms))
			second := hook.latest()
			if !probe.Allowed {
				second = admitFrom(t, b, hook, resource)
			}
			if apart := second.UnixMilli() - at.UnixMilli(); apart < 1000 {
				t.Errorf("round %d: two calls admitted %d ms apart in Redis's clock (the first %v into its interval), want at least 1000",
					round, apart, at.Sub(at.Truncate(precision)))
			}
		}
	})
}

// allowAt calls b once, its transaction sent once Redis's estimated time
// is at.
func allowAt(t *testing.T, b *Bucket, hook *stallHook, resource string, at time.Time) Result {
	t.Helper()
	hook.until.Store(at.UnixNano())
	defer hook.until.Store(0)
	res, err := b.Allow(context.Background(), resource, "c")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// admitFrom calls b, with short pauses, until a call of resource is
// admitted, and returns the Redis time of its decision.
func admitFrom(t *testing.T, b *Bucket, hook *stallHook, resource string) time.Time {
	t.Helper()
	for range 2000 {
		res, err := b.Allow(context.Background(), resource, "c")
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			return hook.latest()
		}
		// A short pause, so that on fake time too the clock moves.
		time.Sleep(max(res.RetryAfter-ms, 100*time.Microsecond))
	}
	t.Fatal("no call admitted in 2000")
	return time.Time{}
}

// jumpBeforeDecisions moves miniredis's clock 2*clock.Jump further ahead before
// each of the next decisions (transactions that carry TIME) is sent: left
// of them, or every one if left is negative. Redis then runs each too
// long after its stamp, as after a stall between stamping and sending.
type jumpBeforeDecisions struct {
	mini *miniredis.Miniredis
	left atomic.Int64
	mu   sync.Mutex
	at   time.Time // where the clock was moved to last
}

func (h *jumpBeforeDecisions) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *jumpBeforeDecisions) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *jumpBeforeDecisions) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		decision := len(cmds) > 1 && commandName(cmds[0]) == "multi" &&
			slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return commandName(c) == "time" })
		if decision && (h.left.Load() < 0 || h.left.Add(-1) >= 0) {
			h.mu.Lock()
			if now := time.Now(); h.at.Before(now) {
				h.at = now
			}
			h.at = h.at.Add(2 * clock.Jump)
			h.mini.SetTime(h.at)
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// A decision that Redis keeps running too long after its stamp is made
// again until it is not: four in a row still end in a Result, where the
// decision used to fail after three with an error that matched no
// sentinel; and a call whose decisions never stop running late gets its
// context's error once it ends, with nothing of it counted.
// The clock is miniredis's to move, so the test runs there alone; on real
// Redis, TestStallBeforeSend stalls decisions under the redo threshold.
func TestMadeAgainUntilOnTime(t *testing.T) {
	for _, s := range []Strategy{Windows(50 * ms), FixedWindows, SortedSet} {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { madeAgainUntilOnTime(t, newMiniEnv(t, s)) })
		})
	}
}

func madeAgainUntilOnTime(t *testing.T, e *env) {
	hook := &jumpBeforeDecisions{mini: e.mini}
	e.addHook(hook)
	b := e.bucket(t, PerClient(Per(5, time.Minute)))
	if _, err := b.Peek(context.Background(), "r", "c"); err != nil { // the first estimate of Redis's clock
		t.Fatal(err)
	}
	hook.left.Store(4)
	if res, err := b.Allow(context.Background(), "r", "c"); err != nil || !res.Allowed {
		t.Errorf("after four decisions in a row ran late: %+v, %v; want admitted", res, err)
	}
	hook.left.Store(-1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if res, err := b.Allow(ctx, "r", "c"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("while every decision runs late: %+v, %v; want the context's deadline", res, err)
	}
	hook.left.Store(0)
	if used := usedNow(t, b, "r", "c", 0); used != 1 {
		t.Errorf("the rule counts %d, want the one admitted call", used)
	}
}

// The adversary of the early count seen by others: a process stalls 40 ms
// between stamping a call and sending it, so that Redis runs it 40 ms
// after its members' score (under Windows(10ms), intervals after its
// stamp's), then pauses (a GC pause, SIGSTOP) before the transaction
// that settles it: scores the members again, or moves the weight to the
// interval Redis ran it in. Meanwhile another process decides
// a call 80 ms later, in Redis's clock: by the early score the first call
// has left its window of 100 ms, by when it ran it has not. The limit is
// 1 per 100 ms, so at most one of the two calls may be admitted: the
// first, re-scored too late to know that no one left it out, must not
// be. (It was, in every round: under SortedSet before the re-scoring
// ran before the callers were answered, with its own TIME; under Windows
// before the move did.)
func TestEarlyCountSeenByOthers(t *testing.T) {
	eachOf(t, []Strategy{SortedSet, Windows(10 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the settling is a Redis transaction")
		const window = 100 * time.Millisecond
		hold := &lateThenHeldRescoring{stallOnce: stallOnce{d: 4 * clock.Jump / 5}}
		e.addHook(hold)
		rule := PerClient(Per(1, window))
		first, other := e.bucket(t, rule), e.bucketOn(t, e.secondClient(t), rule)
		for round := range 5 {
			resource := "r" + strconv.Itoa(round)
			peekClockRun(t, first, resource)
			hold.ran.Store(0)
			hold.entered, hold.release = make(chan struct{}), make(chan struct{})
			hold.armed.Store(true)
			answer := make(chan outcome, 1)
			go func() {
				res, err := allowBounded(first, 10*time.Second, resource, "c", 1)
				answer <- outcome{res, err}
			}()
			select {
			case <-hold.entered:
			case o := <-answer:
				t.Fatalf("round %d: the late call was answered (%+v, %v) before it was scored again", round, o.res, o.err)
			}
			ran := hold.ran.Load()
			for serverMillis(t, e) < ran+80 {
				time.Sleep(time.Millisecond)
			}
			res, err := allowBounded(other, 10*time.Second, resource, "c", 1)
			decided := serverMillis(t, e)
			close(hold.release)
			o := <-answer
			if err != nil || o.err != nil {
				t.Fatalf("round %d: %v; %v", round, err, o.err)
			}
			if o.res.Allowed && res.Allowed && decided < ran+window.Milliseconds() {
				t.Errorf("round %d: Per(1, %v) admitted a call Redis ran at %d and another decided by %d", round, window, ran, decided)
			}
		}
	})
}

// A caller that gives up while its late call is being settled (its
// members scored again, or its weight moved) leaves nothing counted once the take-back lands:
// the call is taken back, as any call of a caller gone before it was
// evaluated.
func TestGoneDuringSettlingLeavesNothing(t *testing.T) {
	eachOf(t, []Strategy{SortedSet, Windows(10 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the settling is a Redis transaction")
		hold := &lateThenHeldRescoring{stallOnce: stallOnce{d: clock.Jump / 2, entered: make(chan struct{}), release: make(chan struct{})}}
		e.addHook(hold)
		b := e.bucket(t, PerClient(Per(3, time.Minute)))
		peekClockRun(t, b, "r")
		hold.armed.Store(true)
		ctx, cancel := context.WithCancel(context.Background())
		answer := make(chan error, 1)
		go func() {
			res, err := b.Allow(ctx, "r", "c")
			if err == nil {
				err = fmt.Errorf("answered %+v", res)
			}
			answer <- err
		}()
		<-hold.entered
		cancel()
		close(hold.release)
		if err := <-answer; !errors.Is(err, context.Canceled) {
			t.Fatalf("the call whose caller gave up during its settling: %v, want its context's error", err)
		}
		// The take-back runs detached from the caller, who is answered
		// as soon as it gives up: it lands within a round trip, or a few
		// when a first attempt fails.
		used := usedNow(t, b, "r", "c", 0)
		for deadline := time.Now().Add(2 * time.Second); used != 0 && time.Now().Before(deadline); used = usedNow(t, b, "r", "c", 0) {
			time.Sleep(10 * time.Millisecond)
		}
		if used != 0 {
			t.Errorf("2s after a caller gave up during its settling, the rule counts %d, want 0", used)
		}
	})
}

// The adversary of a move that lands after a Flush: a call of client c,
// which Redis runs in a later interval than its stamp's (a stall), is held
// before its weight is moved to that interval, while another process
// flushes c. Flush takes c's share out of the resource's hash where c's
// hash held it, at the stamp's interval; the move, landing after, must not
// then move that share again, out of the stamp's interval (left below zero,
// which a read counts as none) and into the later one, where it would be
// counted again. Afterwards the resource counts nothing, a full read and
// the totals alike (the bound of a call sent Far), so that it admits
// exactly its limit, whichever way each call is read.
func TestFlushDuringMoveForgetsTheCall(t *testing.T) {
	eachOf(t, []Strategy{Windows(10 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the settling is a Redis transaction")
		const limit = 10
		rules := []Option{PerResource(Per(limit, time.Minute)), PerClient(Per(4, time.Minute))}
		hold := &lateThenHeldRescoring{stallOnce: stallOnce{d: clock.Jump / 2, entered: make(chan struct{}), release: make(chan struct{})}}
		e.addHook(hold)
		b, other := e.bucket(t, rules...), e.bucketOn(t, e.secondClient(t), rules...)
		peekClockRun(t, b, "r")
		hold.armed.Store(true)
		answer := make(chan outcome, 1)
		go func() {
			res, err := allowBounded(b, 10*time.Second, "r", "c", 2)
			answer <- outcome{res, err}
		}()
		<-hold.entered
		if err := other.Flush(context.Background(), "r", "c"); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		close(hold.release)
		if o := <-answer; o.err != nil {
			t.Fatalf("the late call: %v", o.err)
		}
		if used := usedNow(t, other, "r", "probe", 0); used != 0 {
			t.Errorf("after the flush and the move, the resource counts %d, want 0", used)
		}
		admitted := 0
		for ; admitted <= limit; admitted++ {
			res, err := allowBounded(other, 10*time.Second, "r", fmt.Sprint("fill", admitted), 1)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed {
				break
			}
		}
		if used := usedNow(t, other, "r", "probe", 0); admitted != limit || used != limit {
			t.Errorf("the resource then admitted %d and counts %d, want %d and %d", admitted, used, limit, limit)
		}
	})
}

// The adversary of a move whose guard never holds: a call of client c,
// which Redis runs in a later interval than its stamp's (a stall), has its
// weight moved under a WATCH of c's hash; another process decides for c
// between that WATCH and the move's EXEC, every time it is sent, so that
// the move never runs. The call is not failed for it ("transaction
// failed" is no answer: Redis was reachable and nothing was lost): it is
// taken back and decided again, and counted once, as are the other
// process's calls.
func TestMoveThatNeverRunsDecidesAgain(t *testing.T) {
	eachOf(t, []Strategy{Windows(10 * ms)}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the settling is a Redis transaction")
		rules := []Option{PerResource(Per(100, time.Minute)), PerClient(Per(40, time.Minute))}
		other := e.bucketOn(t, e.secondClient(t), rules...)
		race := &lateThenRacedMove{d: clock.Jump / 2, race: func() error {
			_, err := allowBounded(other, 10*time.Second, "r", "c", 1)
			return err
		}}
		e.addHook(race)
		b := e.bucket(t, rules...)
		peekClockRun(t, b, "r")
		race.armed.Store(true)
		res, err := allowBounded(b, 10*time.Second, "r", "c", 2)
		race.armed.Store(false)
		if err != nil {
			t.Fatalf("the late call, its move raced %d times: %v", race.raced.Load(), err)
		}
		if race.raced.Load() == 0 {
			t.Fatal("no move was raced: the call was not late")
		}
		want := int(race.raced.Load())
		if res.Allowed {
			want += 2
		}
		if used := usedNow(t, other, "r", "c", 1); used != want {
			t.Errorf("the client counts %d, want %d (%d raced calls, the late call admitted: %v)", used, want, race.raced.Load(), res.Allowed)
		}
	})
}

// lateThenRacedMove stalls the first decision it sees, while armed, by d,
// so that Redis runs it in a later interval than its stamp's; then, before
// every transaction that only moves weight, it runs race (another
// process's decision for the same client), which changes the hash the
// move WATCHes, so that the move does not run.
type lateThenRacedMove struct {
	pipelinesOnly
	d     time.Duration
	race  func() error
	armed atomic.Bool
	late  atomic.Bool
	raced atomic.Int64
}

func (h *lateThenRacedMove) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch {
		case !h.armed.Load():
		case !h.late.Load() && decides(cmds):
			h.late.Store(true)
			time.Sleep(h.d)
		case h.late.Load() && moveOnly(cmds):
			if err := h.race(); err != nil {
				return err
			}
			h.raced.Add(1)
		}
		return next(ctx, cmds)
	}
}

// pipelinesOnly is embedded by a hook that acts on pipelines only (every
// MULTI/EXEC is one): it lets dials and single commands through.
type pipelinesOnly struct{}

func (pipelinesOnly) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (pipelinesOnly) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
