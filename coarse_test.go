package leakybucket

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// Windows, reading coarse blocks while a call is far from its limits,
// decides exactly as a whole read does: random calls of random weights to
// three Buckets on one miniredis, as three processes, interleaved, with
// Flush, FlushAll, lost replies (the transaction ran, its reply did not
// come back) and steps of the clock past every window. Before each call,
// PeekN reads the whole hashes (as every decision did before blocks) and
// says what the call's exact Result is on the same counts at the same
// time: the call must get the same admission or denial, and where
// admitted a Remaining never above the exact one, exact where the
// Result's doc says (withinBounds). A model in process could not stand in
// for the whole read here: after a lost reply the calls may stay counted,
// by design (see docs/design.md).
func TestWindowsCoarseMatchesWholeRead(t *testing.T) {
	configs := map[string]struct {
		rules []Option
		most  int // the largest weight
	}{
		"one precision":  {[]Option{PerResource(Per(2000, 1500*ms)), PerClient(Per(500, 300*ms)), PerClient(Per(200, 200*ms))}, 60},
		"two precisions": {[]Option{PerResource(Per(3000, 2*time.Second)), PerClient(Per(600, time.Second).WithPrecision(5 * ms))}, 80},
	}
	for name, c := range configs {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newMiniEnv(t, Windows(ms))
				var procs []*Bucket
				for i := range 3 {
					rdb := miniClient(e.mini)
					rdb.AddHook(&loseReplies{rng: rand.New(rand.NewPCG(uint64(i), 11))})
					t.Cleanup(func() { rdb.Close() })
					b, err := New(rdb, append([]Option{WithStrategy(Windows(ms)), WithPrefix(e.prefix), WithoutBreaker()}, c.rules...)...)
					if err != nil {
						t.Fatal(err)
					}
					if !coarse(b) {
						t.Fatal("the Bucket keeps no coarse blocks: nothing to test")
					}
					procs = append(procs, b)
				}
				compareWholeRead(t, procs, c.most, uint64(len(name)))
			})
		})
	}
}

// compareWholeRead makes 2000 random calls of weight up to most, each to
// a random one of procs, and fails at the first whose Result is not
// within the bounds of its whole read's. A call whose reply was lost is
// an error. Flush and FlushAll go to every process, so that none answers
// from its denial cache what another process's flush changed (which is
// seen within a second, by design).
func compareWholeRead(t *testing.T, procs []*Bucket, most int, seed uint64) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 7))
	lost, bounded, denied := 0, 0, 0
	for i := range 2000 {
		wait := time.Duration(rng.IntN(30)) * ms
		if rng.IntN(100) == 0 {
			wait = time.Duration(2+rng.IntN(3)) * time.Second // a step past every window
		}
		time.Sleep(wait)
		p := procs[rng.IntN(len(procs))]
		client, n := "c"+strconv.Itoa(rng.IntN(4)), 1+rng.IntN(most)
		switch k := rng.IntN(60); k {
		case 0:
			for _, p := range procs {
				if err := p.Flush(ctx, "r", client); err != nil {
					t.Fatalf("call %d, Flush: %v", i, err)
				}
			}
		case 1:
			for _, p := range procs {
				if err := p.FlushAll(ctx, "r"); err != nil {
					t.Fatalf("call %d, FlushAll: %v", i, err)
				}
			}
		default:
			want, err := p.PeekN(ctx, "r", client, n)
			if err != nil {
				t.Fatalf("call %d, PeekN: %v", i, err)
			}
			got, err := p.AllowN(ctx, "r", client, n)
			if errors.Is(err, errLost) {
				lost++
				time.Sleep(100 * ms) // the Bucket takes the calls back, in the background
				continue
			}
			if err != nil || !withinBounds(got, want, p.Rules()) {
				t.Fatalf("call %d, AllowN(%s, %d): %+v, %v; the whole read: %+v", i, client, n, got, err, want)
			}
			if !got.Allowed {
				denied++
			} else if !reflect.DeepEqual(got, want) {
				bounded++
			}
		}
	}
	t.Logf("%d replies lost, %d denials, %d admissions answered with a bound", lost, denied, bounded)
	if lost == 0 || bounded == 0 || denied == 0 {
		t.Errorf("lost %d replies, denied %d calls and bounded %d admissions: the test tested too little", lost, denied, bounded)
	}
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
