package leakybucket

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// stallOnce holds the next MULTI/EXEC its client sends, once armed, for
// at least d and until release is closed: a process that stalls between
// stamping its calls and sending them (a GC pause, a starved CPU), or a
// server paused with the transaction unread.
type stallOnce struct {
	d       time.Duration
	armed   atomic.Bool
	entered chan struct{} // closed once the stalled transaction is held
	release chan struct{}
}

func (s *stallOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (s *stallOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (s *stallOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" && s.armed.CompareAndSwap(true, false) {
			close(s.entered)
			time.Sleep(s.d)
			<-s.release
		}
		return next(ctx, cmds)
	}
}

// The adversary of a set's deadline: a decision that Redis runs long after
// its stamp (more than the window and twice clock.LagLimit) comes after
// another process filled the rule with calls stamped later. Its calls are
// taken back and decided again, as any decision that ran too far from its
// stamp; but its transaction ran, deadline included. A deadline counted
// from the late stamp (stamp + window + 2 LagLimit) would lie in the past
// and delete the set with the calls the other process was admitted with:
// the late call, decided again, would then be admitted past the limit. The
// set must keep every call it counts.
func TestSortedSetLateTransactionKeepsCounts(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "a set's deadline")
		const window, limit = time.Second, 3
		stall := 2*clock.LagLimit + window + 500*time.Millisecond
		hold := &stallOnce{d: stall, entered: make(chan struct{}), release: make(chan struct{})}
		e.addHook(hold)
		rule := PerClient(Per(limit, window))
		late, other := e.bucket(t, rule), e.bucket(t, rule)
		for _, b := range []*Bucket{late, other} {
			if _, err := b.Peek(context.Background(), "r", "z"); err != nil { // the first estimate of Redis's clock
				t.Fatal(err)
			}
		}
		hold.armed.Store(true)
		answer := make(chan outcome, 1)
		go func() {
			res, err := allowBounded(late, stall+10*time.Second, "r", "c", 1)
			answer <- outcome{res, err}
		}()
		<-hold.entered
		time.Sleep(stall - 300*time.Millisecond)
		for i := range limit { // stamped later than the late call, within a window of its transaction
			if res, err := allowBounded(other, 5*time.Second, "r", "c", 1); err != nil || !res.Allowed {
				t.Fatalf("call %d of the other process: %+v, %v; want admitted", i+1, res, err)
			}
		}
		close(hold.release)
		o := <-answer
		if o.err != nil {
			t.Fatal(o.err)
		}
		if o.res.Allowed {
			t.Errorf("the late call was admitted (%+v) right after %d calls of a limit of %d in one window", o.res, limit, limit)
		}
		if used := usedNow(t, other, "r", "c", 0); used != limit {
			t.Errorf("after the late transaction the rule counts %d, want %d", used, limit)
		}
	})
}

// holdOnce holds the first MULTI/EXEC its client sends with a ZREM in it
// (a take-back), once armed, until release is closed.
type holdOnce struct {
	armed   atomic.Bool
	entered chan struct{} // closed once the take-back is held
	release chan struct{}
}

func (h *holdOnce) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "zrem" }) && h.armed.CompareAndSwap(true, false) {
			close(h.entered)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// The adversary of a denial's RetryAfter: a call another process wrote and
// then denied may stay in the set until its take-back lands, so that a
// set holds more than its limit. A call denied meanwhile must get the
// RetryAfter of the counts it read: when its second oldest leaves if the
// other's write was gone (3 counted, and the call weighs 2), its third if
// not (4 counted); never one read from too few of the oldest (0, as if
// there were room). Once the take-back landed, the second.
func TestSortedSetDeniedBesideAWriteNotTakenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, SortedSet)
		hold := &holdOnce{entered: make(chan struct{}), release: make(chan struct{})}
		e.addHook(hold)
		rule := PerClient(Per(3, time.Minute))
		filler, other, caller := e.bucket(t, rule), e.bucket(t, rule), e.bucket(t, rule)
		for range 3 {
			mustAdmit(t, filler, "r", "c", 1) // at 0, 1 and 2 s
			time.Sleep(time.Second)
		}
		time.Sleep(7 * time.Second)
		hold.armed.Store(true)
		answer := make(chan outcome, 1)
		go func() { // it saw nothing: it writes, is denied, and its take-back, if any, is held
			res, err := allowBounded(other, time.Minute, "r", "c", 1)
			answer <- outcome{res, err}
		}()
		var answered *outcome
		select {
		case <-hold.entered:
		case o := <-answer: // nothing to take back: its write is gone already
			answered = &o
		}
		res, err := allowBounded(caller, time.Second, "r", "c", 2)
		if err != nil {
			t.Fatal(err)
		}
		untilRoom := map[int]time.Duration{3: 51 * time.Second, 4: 52 * time.Second} // by count
		if want, ok := untilRoom[res.Rules[0].Used]; res.Allowed || !ok || res.RetryAfter != want {
			t.Errorf("beside the write not taken back: %+v; want denied, with 3 counted and RetryAfter 51s or 4 and 52s", res)
		}
		close(hold.release)
		if answered == nil {
			o := <-answer
			answered = &o
		}
		if o := answered; o.err != nil || o.res.Allowed || o.res.RetryAfter != 50*time.Second {
			t.Errorf("the other process's call: %+v, %v; want denied, RetryAfter 50s", o.res, o.err)
		}
		if res, err = allowBounded(caller, time.Second, "r", "c", 2); err != nil || res.Allowed || res.RetryAfter != 51*time.Second || res.Rules[0].Used != 3 {
			t.Errorf("once the take-back landed: %+v, %v; want denied, 3 counted, RetryAfter 51s", res, err)
		}
	})
}

// Two rules of one scope and window count the same calls, whatever set
// holds them: the tighter decides, each reports its own room from the same
// count, and a Flush empties both. Per-resource, a second client's calls
// count under both too.
func TestSortedSetRulesOfOneWindow(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		for _, perClient := range []bool{true, false} {
			tight := Rule{PerClient: perClient, Limit: Per(3, time.Minute)}
			b := e.bucket(t, ruleOption(Rule{PerClient: perClient, Limit: Per(5, time.Minute)}), ruleOption(tight))
			resource := "r" + strconv.FormatBool(perClient)
			checkSameWindow := func(res Result, used int) {
				t.Helper()
				for i, limit := range []int{5, 3} {
					if got := res.Rules[i].Used; got != used {
						t.Errorf("rule %d (limit %d) counts %d, want %d: %+v", i, limit, got, used, res)
					}
					if got := res.Rules[i].Remaining; got != max(limit-used, 0) {
						t.Errorf("rule %d (limit %d) has %d left, want %d: %+v", i, limit, got, max(limit-used, 0), res)
					}
				}
			}
			for i := range 3 {
				res, err := b.Allow(context.Background(), resource, "c")
				if err != nil || !res.Allowed {
					t.Fatalf("call %d: %+v, %v; want admitted", i+1, res, err)
				}
				checkSameWindow(res, i+1)
			}
			res, err := b.Allow(context.Background(), resource, "c")
			if err != nil || res.Allowed || len(res.DeniedBy) != 1 || res.DeniedBy[0] != tight {
				t.Fatalf("the 4th call: %+v, %v; want denied by the tighter rule alone", res, err)
			}
			checkSameWindow(res, 3)
			if !perClient {
				if res, err := b.Allow(context.Background(), resource, "d"); err != nil || res.Allowed {
					t.Fatalf("another client of the full resource: %+v, %v; want denied", res, err)
				}
			}
			if err := b.Flush(context.Background(), resource, "c"); err != nil {
				t.Fatal(err)
			}
			res, err = b.Allow(context.Background(), resource, "c")
			if err != nil || !res.Allowed {
				t.Fatalf("after the Flush: %+v, %v; want admitted", res, err)
			}
			checkSameWindow(res, 1)
		}
	})
}

// lateThenHeld makes the first MULTI/EXEC its client sends once armed run
// late (it sleeps d, under clock.Jump, after the calls were stamped), and
// holds the next one, which scores the late calls again: entered is
// closed once it is held, until release is closed.
type lateThenHeld struct {
	stallOnce
	seen atomic.Int32
}

func (h *lateThenHeld) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" && h.armed.Load() {
			switch h.seen.Add(1) {
			case 1:
				time.Sleep(h.d)
			case 2:
				h.armed.Store(false)
				close(h.entered)
				<-h.release
			}
		}
		return next(ctx, cmds)
	}
}

// The adversary of the late re-scoring: a decision Redis ran well after
// its stamp (a stalled process) has its admitted call scored again with
// the transaction's time, by a transaction of its own. A Flush of the
// client that lands between the two removed the call: the re-scoring must
// not put it back, or the client would be counted a call it was flushed
// of until its window ends.
func TestSortedSetFlushBeforeLateRescoring(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the re-scoring is a Redis transaction")
		for _, rule := range []Rule{{PerClient: true, Limit: Per(3, time.Minute)}, {Limit: Per(3, time.Minute)}} {
			hold := &lateThenHeld{stallOnce: stallOnce{d: clock.Jump / 2, entered: make(chan struct{}), release: make(chan struct{})}}
			e.addHook(hold)
			late, flusher := e.bucket(t, ruleOption(rule)), e.bucket(t, ruleOption(rule))
			resource := "r" + strconv.FormatBool(rule.PerClient)
			if _, err := late.Peek(context.Background(), resource, "z"); err != nil { // the first estimate of Redis's clock
				t.Fatal(err)
			}
			flushBeforeRescoring(t, rule, late, flusher, &hold.stallOnce, resource, fmt.Sprintf("ran %v after its stamp", hold.d), "late")
		}
	})
}

// flushBeforeRescoring has b decide a call of client c while hold, once
// armed, holds the transaction that scores it again (what says why it
// is), Flushes the client with flusher meanwhile, then releases it: the
// call must be answered only after it, admitted, and counted nowhere.
func flushBeforeRescoring(t *testing.T, rule Rule, b, flusher *Bucket, hold *stallOnce, resource, what, name string) {
	t.Helper()
	hold.armed.Store(true)
	answer := make(chan outcome, 1)
	go func() {
		res, err := allowBounded(b, time.Minute, resource, "c", 1)
		answer <- outcome{res, err}
	}()
	select {
	case <-hold.entered:
	case o := <-answer:
		t.Fatalf("a decision that %s was answered (%+v, %v) without scoring its call again", what, o.res, o.err)
	}
	if err := flusher.Flush(context.Background(), resource, "c"); err != nil {
		t.Fatal(err)
	}
	close(hold.release)
	if o := <-answer; o.err != nil || !o.res.Allowed {
		t.Fatalf("the %s call: %+v, %v; want admitted", name, o.res, o.err)
	}
	if used := usedNow(t, flusher, resource, "c", 0); used != 0 {
		t.Errorf("%v: after a Flush that landed before the re-scoring, the rule counts %d, want 0", rule, used)
	}
}

// WithRecordDenied, a call written to a full set makes the cap drop the
// oldest member: a call admitted in the window. Taking the call back
// afterwards (its caller gone by the time it is decided) would leave the
// set one short of what was admitted, and the next call admitted past the
// limit. The call stays counted instead, as an attempt that reached
// Redis.
func TestSortedSetCappedCallOfAGoneCallerStaysCounted(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "a hook ends the caller's context after the transaction")
		hook := &cancelAfterExec{}
		e.addHook(hook)
		b := e.bucket(t, PerClient(Per(3, time.Minute)), WithRecordDenied())
		for range 3 {
			mustAdmit(t, b, "r", "c", 1)
			time.Sleep(time.Second)
		}
		ctx, cancel := context.WithCancel(context.Background())
		hook.arm(cancel)
		if res, err := b.Allow(ctx, "r", "c"); err == nil && res.Allowed {
			t.Fatalf("the gone caller's call on a full window: %+v, admitted", res)
		}
		time.Sleep(time.Second)
		if res, err := b.Allow(context.Background(), "r", "c"); err != nil || res.Allowed {
			t.Errorf("a call within the minute of 3 admitted: %+v, %v; want denied", res, err)
		}
	})
}

// cancelAfterExec ends a caller's context once the next MULTI/EXEC has
// run: the caller is gone when its call is decided.
type cancelAfterExec struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (h *cancelAfterExec) arm(cancel context.CancelFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cancel = cancel
}

func (h *cancelAfterExec) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *cancelAfterExec) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *cancelAfterExec) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if len(cmds) > 0 && cmds[0].Name() == "multi" {
			h.mu.Lock()
			cancel := h.cancel
			h.cancel = nil
			h.mu.Unlock()
			if cancel != nil {
				cancel()
			}
		}
		return err
	}
}

// A take-back sent alone, of the call of a caller gone once its
// transaction ran, sets a marker key of its line's (and gives it back once
// it ran), not one of its own: under Windows, the marker of a take-back
// lives as long as the hashes it changed (an hour here), so one key per
// take-back would pile up with them.
func TestTakeBacksAloneKeepFewMarkers(t *testing.T) {
	eachOf(t, []Strategy{Windows(50 * time.Millisecond), SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "a hook ends the caller's context after the transaction")
		hook := &cancelAfterExec{}
		e.addHook(hook)
		b := e.bucket(t, PerClient(Per(1000, time.Hour)))
		const gone = 40
		for range gone {
			ctx, cancel := context.WithCancel(context.Background())
			hook.arm(cancel)
			if res, err := b.Allow(ctx, "r", "c"); err == nil && res.Allowed {
				t.Fatalf("the gone caller's call: %+v, admitted", res)
			}
		}
		// A gone caller's call is taken back, if not before it returns,
		// soon after: then the window holds none of them, and few marker
		// keys.
		var res Result
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if res, err = b.Peek(context.Background(), "r", "c"); err == nil && res.Remaining == 999 {
				break
			}
		}
		if err != nil || res.Remaining != 999 {
			t.Fatalf("5 s after %d gone callers, a call would leave %+v, %v; want 999 remaining", gone, res, err)
		}
		var markers []string
		for _, key := range e.keys(t) {
			if strings.Contains(key, "}:fence:") {
				markers = append(markers, key)
			}
		}
		if len(markers) > 10 {
			t.Errorf("%d take-backs sent alone left %d marker keys: %v", gone, len(markers), markers)
		}
	})
}

// earlyThenHeld, while slow, delays every request its client sends by
// ahead before sending it, so that the estimate of Redis's clock taken
// from their replies runs ahead of it, and with it the score a
// transaction is expected to run at; once armed, it holds the first
// transaction that scores members earlier (ZADD XX LT): entered is closed
// once it is held, until release is closed.
type earlyThenHeld struct {
	stallOnce
	slow atomic.Bool
}

func (h *earlyThenHeld) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.slow.Load() {
			time.Sleep(h.d)
		}
		return next(ctx, cmd)
	}
}

func (h *earlyThenHeld) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.slow.Load() {
			time.Sleep(h.d)
		}
		if restampOnly(cmds) && lowers(cmds) && h.armed.CompareAndSwap(true, false) {
			close(h.entered)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// lowers reports whether a transaction's ZADDs score members earlier (LT).
func lowers(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if args := c.Args(); commandName(c) == "zadd" && len(args) > 3 && fmt.Sprint(args[3]) == "lt" {
			return true
		}
	}
	return false
}

// The adversary of the early re-scoring: members are scored with when
// their transaction is expected to run, which may be after Redis ran it
// (here by about 25 ms: the estimate of Redis's clock was taken from
// requests that were slow on their way there); they are scored again with the
// transaction's TIME, toward it (ZADD XX LT), before the caller is
// answered. A Flush of the client that lands between the two removed the
// call: the re-scoring must not put it back.
func TestSortedSetFlushBeforeEarlyRescoring(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "the re-scoring is a Redis transaction")
		for _, rule := range []Rule{{PerClient: true, Limit: Per(3, time.Minute)}, {Limit: Per(3, time.Minute)}} {
			hold := &earlyThenHeld{stallOnce: stallOnce{d: clock.Jump / 2, entered: make(chan struct{}), release: make(chan struct{})}}
			e.addHook(hold)
			early, flusher := e.bucket(t, ruleOption(rule)), e.bucket(t, ruleOption(rule))
			resource := "r" + strconv.FormatBool(rule.PerClient)
			hold.slow.Store(true)
			seeClockRun(t, early, resource)
			hold.slow.Store(false)
			flushBeforeRescoring(t, rule, early, flusher, &hold.stallOnce, resource, "ran before its members' score", "early")
		}
	})
}

// seeClockRun has b make decisions of another client of resource,
// milliseconds apart, each of which reads Redis's clock (TIME), so that
// it sees the clock of the node that owns resource run (clock.Clock's
// pace); then it flushes that client, which counts nothing more.
func seeClockRun(t *testing.T, b *Bucket, resource string) {
	t.Helper()
	for range 3 {
		mustAdmit(t, b, resource, "w", 1)
		time.Sleep(3 * time.Millisecond)
	}
	if err := b.Flush(context.Background(), resource, "w"); err != nil {
		t.Fatal(err)
	}
}

// lateThenHeldRescoring, once armed, delays its client's next decision
// (a MULTI that trims a set or adds to a hash) by d, under clock.Jump, so
// that Redis runs it in a later millisecond than its members' score (or a
// later interval than its stamp's, under Windows), keeps the TIME it ran
// at, and holds the transaction that settles it (scores the members again,
// or moves the weight): entered is closed once it is held, until release
// is closed.
type lateThenHeldRescoring struct {
	stallOnce
	ran atomic.Int64 // ms
}

func (h *lateThenHeldRescoring) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		switch {
		case !h.armed.Load():
		case h.ran.Load() == 0 && decides(cmds):
			time.Sleep(h.d)
			err := next(ctx, cmds)
			if at, ok := execTime(cmds); ok {
				h.ran.Store(at)
			}
			return err
		case h.ran.Load() > 0 && (restampOnly(cmds) || moveOnly(cmds)):
			h.armed.Store(false)
			close(h.entered)
			<-h.release
		}
		return next(ctx, cmds)
	}
}

// decides reports whether a pipeline is a decision: it trims a sorted set
// (SortedSet), or reads a generation and adds to a hash (Windows).
func decides(cmds []redis.Cmder) bool {
	has := func(name string) bool {
		return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return commandName(c) == name })
	}
	return has("zremrangebyscore") || has("get") && has("hincrby") && has("time")
}

// execTime returns the TIME a MULTI/EXEC ran at, in ms, from its reply.
func execTime(cmds []redis.Cmder) (int64, bool) {
	if len(cmds) < 2 {
		return 0, false
	}
	var replies []any
	switch exec := cmds[len(cmds)-1].(type) {
	case *redis.SliceCmd:
		replies = exec.Val()
	case *redis.Cmd:
		replies, _ = exec.Val().([]any)
	}
	for i, c := range cmds[1 : len(cmds)-1] {
		if commandName(c) == "time" && i < len(replies) {
			if at, ok := txn.ReplyTime(replies[i]); ok {
				return at.UnixMilli(), true
			}
		}
	}
	return 0, false
}

// peekClockRun has b look at client "c" of resource, milliseconds apart,
// so that it sees the clock of the node that owns resource run, without
// writing: seeClockRun's calls would fill a limit of 1.
func peekClockRun(t *testing.T, b *Bucket, resource string) {
	t.Helper()
	for range 3 {
		if _, err := b.Peek(context.Background(), resource, "c"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Millisecond)
	}
}
