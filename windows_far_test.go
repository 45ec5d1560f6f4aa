package leakybucket

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// Windows decides a call far from its limits on the totals of its
// epochs, a bound of its counts, and every other call on every interval.
// Its decisions must be exactly those of a read of every interval: random
// calls of random weights to three Buckets on one miniredis, as three
// processes, interleaved, with Flush, FlushAll, lost replies (the
// transaction ran, its reply did not come back) and steps of the clock
// past every window. Before each call two reads of every interval say
// what its exact Result is on the same counts at the same time: PeekN,
// and the test's own model, which reads every field of every hash of the
// resource's generation and counts each rule's window itself (and must
// agree with PeekN). The call must get the same admission or denial, and
// where admitted a Remaining never above the exact one, exact where the
// Result's doc says (withinBounds). (An in-process model of the calls
// could not stand in for the reads: after a lost reply the calls may stay
// counted, by design, see docs/design.md.)
func TestWindowsDecidesAsTheWholeRead(t *testing.T) {
	configs := map[string]struct {
		strategy Strategy
		rules    []Option
		most     int // the largest weight
	}{
		"small limits": {Windows(ms), []Option{PerResource(Per(12, 1500*ms)), PerClient(Per(5, 300*ms)), PerClient(Per(3, 100*ms))}, 3},
		"large limits": {Windows(ms), []Option{PerResource(Per(300, 2*time.Second)), PerClient(Per(60, time.Second).WithPrecision(5 * ms))}, 8},
		"per client":   {Windows(50 * ms), []Option{PerClient(Per(100, time.Second)), PerClient(Per(40, 200*ms))}, 12},
		"fixed and sliding": {FixedWindows, []Option{PerResource(Per(200, time.Second)),
			PerClient(Per(50, 600*ms).WithPrecision(20 * ms)), PerClient(Per(30, 300*ms))}, 10},
	}
	// Every config reads bounds: far calls are admitted on them; some
	// calls are left undecided by them, and decided on a second read.
	confirms := &confirmCount{}
	base := propertySeed(t)
	t.Run("configs", func(t *testing.T) {
		for name, c := range configs {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				seed := base + uint64(len(name))
				t.Logf("seed %d (LEAKYBUCKET_SEED=%d runs this config again)", seed, base)
				synctest.Test(t, func(t *testing.T) {
					e := newMiniEnv(t, c.strategy)
					var procs []*Bucket
					for i := range 3 {
						rdb := miniClient(e.mini)
						rdb.AddHook(&loseReplies{rng: rand.New(rand.NewPCG(seed+uint64(i), 11))})
						rdb.AddHook(confirms)
						t.Cleanup(func() { rdb.Close() })
						b, err := New(rdb, append([]Option{WithStrategy(c.strategy), WithPrefix(e.prefix), WithoutBreaker()}, c.rules...)...)
						if err != nil {
							t.Fatal(err)
						}
						procs = append(procs, b)
					}
					compareWholeRead(t, e, procs, c.most, seed)
				})
			})
		}
	})
	if n := confirms.n.Load(); n == 0 {
		t.Error("no call was left undecided by a bound and read again: the test tested too little")
	} else {
		t.Logf("%d reads of calls left undecided by a bound", n)
	}
}

// propertySeed is the seed of a property test's random calls:
// LEAKYBUCKET_SEED if set, to run again what a failure logged, else 1, so
// that every run makes the same calls.
func propertySeed(t *testing.T) uint64 {
	t.Helper()
	v := os.Getenv("LEAKYBUCKET_SEED")
	if v == "" {
		return 1
	}
	seed, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("LEAKYBUCKET_SEED=%q: %v", v, err)
	}
	return seed
}

// confirmCount counts the transactions that read again the hashes of
// calls a bound left undecided: GET, TIME and HGETALL, writing nothing.
type confirmCount struct{ n atomic.Int64 }

func (c *confirmCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *confirmCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (c *confirmCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := map[string]bool{}
		for _, cmd := range cmds {
			names[commandName(cmd)] = true
		}
		if names["multi"] && names["time"] && names["hgetall"] && !names["hincrby"] && !names["del"] {
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// compareWholeRead makes randomCalls to procs, and fails at the first
// whose Result is not within the bounds of the whole read's. A call whose
// reply was lost is an error.
func compareWholeRead(t *testing.T, e *env, procs []*Bucket, most int, seed uint64) {
	t.Helper()
	lost, bounded, denied := 0, 0, 0
	randomCalls(t, procs, most, seed, nil, func(i int, p *Bucket, client string, n int) {
		want := wholeRead(t, e, p, client, n)
		got, err := p.AllowN(context.Background(), "r", client, n)
		if errors.Is(err, errLost) {
			lost++
			time.Sleep(100 * ms) // the Bucket takes the calls back, in the background
			return
		}
		if err != nil || !withinBounds(got, want, p.Rules()) {
			t.Fatalf("call %d, AllowN(%s, %d): %+v, %v; the whole read: %+v", i, client, n, got, err, want)
		}
		if !got.Allowed {
			denied++
		} else if !reflect.DeepEqual(got, want) {
			bounded++
		}
	})
	t.Logf("%s: %d replies lost, %d denials, %d admissions answered with a bound", t.Name(), lost, denied, bounded)
	if lost == 0 || denied == 0 || bounded == 0 {
		t.Errorf("lost %d replies, denied %d calls and bounded %d admissions: the test tested too little", lost, denied, bounded)
	}
}

// randomCalls makes the property tests' 2000 random calls to resource
// "r": each after a random wait (now and then a step past every window),
// to a random one of procs, by one of four clients, of a weight up to
// most, handed to call. One in sixty is a Flush of its client instead,
// one in sixty a FlushAll, sent to every process, so that none answers
// from its denial cache what another process's flush changed (which is
// seen within a second, by design), and then told to flushed, if not nil
// (its client nil for FlushAll).
func randomCalls(t *testing.T, procs []*Bucket, most int, seed uint64, flushed func(client *string), call func(i int, p *Bucket, client string, n int)) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range 2000 {
		wait := time.Duration(rng.IntN(30)) * ms
		if rng.IntN(100) == 0 {
			wait = time.Duration(2+rng.IntN(3)) * time.Second // a step past every window
		}
		time.Sleep(wait)
		p := procs[rng.IntN(len(procs))]
		client, n := "c"+strconv.Itoa(rng.IntN(4)), 1+rng.IntN(most)
		var who *string // a Flush of who, or if nil a FlushAll
		switch rng.IntN(60) {
		case 0:
			who = &client
		case 1:
		default:
			call(i, p, client, n)
			continue
		}
		if err := flushEvery(ctx, procs, who); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if flushed != nil {
			flushed(who)
		}
	}
}

// flushEvery has every one of procs Flush client of resource "r", or
// FlushAll if client is nil.
func flushEvery(ctx context.Context, procs []*Bucket, client *string) error {
	for _, b := range procs {
		var err error
		if client != nil {
			err = b.Flush(ctx, "r", *client)
		} else {
			err = b.FlushAll(ctx, "r")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// wholeRead is PeekN's Result for a call of weight n by client, checked
// against the test's own read of every interval (modelUsed).
func wholeRead(t *testing.T, e *env, b *Bucket, client string, n int) Result {
	t.Helper()
	want, err := b.PeekN(context.Background(), "r", client, n)
	if err != nil {
		t.Fatalf("PeekN: %v", err)
	}
	for i, rule := range b.Rules() {
		used := modelUsed(t, e, b, rule, client)
		if want.Allowed {
			used += n // PeekN says what AllowN would: counted with the call
		}
		if want.Rules[i].Used != used {
			t.Fatalf("PeekN(%s, %d): rule %v counts %d; every interval read by the test: %d", client, n, rule, want.Rules[i].Used, used)
		}
	}
	return want
}

// modelUsed reads every field of every hash of resource "r" in its
// current generation, and counts what rule counts of them for client now
// (on the synctest clock, which is miniredis's): the weight of each
// interval of the rule's precision whose end is inside its window, or of
// the current fixed window.
func modelUsed(t *testing.T, e *env, b *Bucket, rule Rule, client string) int {
	t.Helper()
	ctx := context.Background()
	r := remoteOf(b)
	ks := r.keysOf("r")
	gen, err := e.admin.Get(ctx, ks.Generation()).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	scope := ks.Hash(gen)
	if rule.PerClient {
		scope = ks.ClientHash(gen, client)
	}
	span, fixed := rule.Limit.Precision.Milliseconds(), false
	if span == 0 {
		w := r.cfg.strategy.(windowsStrategy)
		span, fixed = w.precision.Milliseconds(), w.fixed
	}
	if fixed {
		span = rule.Limit.Window.Milliseconds()
	}
	now, window := time.Now().UnixMilli(), rule.Limit.Window.Milliseconds()
	c, err := r.cfg.strategy.counting(r.plan)
	if err != nil {
		t.Fatal(err)
	}
	layout := c.layout
	used := 0
	for _, key := range e.keys(t) {
		rest, ok := strings.CutPrefix(key, scope+":")
		g, epoch, ok2 := strings.Cut(rest, ".") // <span group>.<epoch>
		gi, err1 := strconv.Atoi(g)
		ei, err2 := strconv.ParseInt(epoch, 10, 64)
		if !ok || !ok2 || err1 != nil || err2 != nil || layout.Spans[gi] != span {
			continue // another scope's, a client's under the resource's, or another span's
		}
		perEpoch := layout.Epochs[gi] / span
		for field, weight := range heldFields(e.admin.HGetAll(ctx, key).Val()) {
			offset, err := strconv.ParseInt(field, 10, 64)
			if err != nil || weight <= 0 || offset < 0 || offset >= perEpoch {
				continue // the incarnation, the total, or an empty interval
			}
			index := ei*perEpoch + offset
			if fixed && index == now/span || !fixed && (index+1)*span-1+window > now {
				used += weight
			}
		}
	}
	return used
}

// errLost is the error of a transaction whose reply loseReplies dropped.
var errLost = errors.New("test: the reply was lost")

// loseReplies drops the reply of one decision in 40, after Redis ran it:
// a decision is a transaction that writes (HINCRBY) and reads TIME.
type loseReplies struct{ rng *rand.Rand }

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil || !isDecision(cmds) || h.rng.IntN(40) != 0 {
			return err
		}
		for _, c := range cmds {
			c.SetErr(errLost)
		}
		return errLost
	}
}

// isDecision reports whether cmds are a Windows decision's transaction.
func isDecision(cmds []redis.Cmder) bool {
	hincrby, time := false, false
	for _, c := range cmds {
		hincrby = hincrby || commandName(c) == "hincrby"
		time = time || commandName(c) == "time"
	}
	return len(cmds) > 0 && commandName(cmds[0]) == "multi" && hincrby && time
}

// TestFlushAllStorm: one Bucket calls FlushAll in a loop while goroutines
// on three others (as processes) call AllowN, weights 1 to 3, on the same
// resource. Under Windows every FlushAll ends the generation the deciders'
// batches are writing to, so decisions keep being made stale and made
// again; none of the calls may fail for it (a storm once failed them with
// "decision to be made again" after 3 stale attempts). A denial is a
// Result, so the only right outcome of every call is a nil error.
func TestFlushAllStorm(t *testing.T) {
	eachOf(t, []Strategy{Windows(ms), Windows(50 * ms), FixedWindows, SortedSet}, func(t *testing.T, e *env) {
		rules := []Option{PerResource(Per(1000, time.Minute)), PerClient(Per(40, time.Second))}
		deciders := []*Bucket{e.bucket(t, rules...), e.bucket(t, rules...), e.bucket(t, rules...)}
		ops := e.bucket(t, rules...)
		ctx := context.Background()
		// The storm flushes again once a call has been made since its last
		// FlushAll: as often as the deciders can be made stale. It waits on
		// a channel, not a loop that yields, so in a synctest bubble it
		// blocks durably and fake time moves on: a caller sleeping in a
		// back-off wakes (a storm that never blocked kept the bubble busy,
		// and a back-off sleep never ended).
		progress, stop := make(chan struct{}, 1), make(chan struct{})
		var flushes atomic.Int64
		var flushErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				if err := ops.FlushAll(ctx, "storm"); err != nil {
					flushErr = err
					return
				}
				flushes.Add(1)
				select {
				case <-progress:
				case <-stop:
					return
				}
			}
		})
		var mu sync.Mutex
		var errs []error
		calls, admitted := 0, 0
		var callers sync.WaitGroup
		for g := range 8 {
			callers.Go(func() {
				// 40 calls each, and more until the storm has raged 10
				// times: a FlushAll on a loaded cluster can take as long
				// as 40 calls.
				for i := 0; i < 40 || flushes.Load() < 10 && i < 4000; i++ {
					res, err := allowBounded(deciders[g%len(deciders)], 10*time.Second, "storm", "c"+strconv.Itoa(g%4), 1+(g+i)%3)
					select {
					case progress <- struct{}{}:
					default:
					}
					mu.Lock()
					calls++
					if err != nil {
						errs = append(errs, err)
					} else if res.Allowed {
						admitted++
					}
					mu.Unlock()
				}
			})
		}
		callers.Wait()
		close(stop)
		wg.Wait()
		if flushErr != nil {
			t.Fatalf("FlushAll: %v", flushErr)
		}
		if len(errs) > 0 {
			t.Fatalf("%d of %d calls failed during a storm of %d FlushAll calls, first: %v", len(errs), calls, flushes.Load(), errs[0])
		}
		if flushes.Load() < 10 && e.local == nil { // in process, no FlushAll makes a decision stale
			t.Errorf("only %d FlushAll calls ran during %d calls: no storm", flushes.Load(), calls)
		}
		t.Logf("%d calls (%d admitted) during %d FlushAll calls, none failed", calls, admitted, flushes.Load())
	})
}
