package leakybucket

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The adversary's test of refunds: hammerers Admit weights of 1 to 3 on
// one key while refunders give back random parts of random admissions, a
// few ms later. Every window [a, b] from a call's start to a call's
// return may hold at most burst + what drains in b-a, counting each call
// that started and returned in it at its weight less what its refunds
// gave back, for refunds sent by b (a refund applies before its reply,
// at the earliest when it is sent; before it is sent, the call counts in
// full), exactly: the fraction of a unit a refund gives back (Refund
// rounds it up) is read from the Admission. Decisions are made at whole
// ms of the clock, so a window's first decision may be up to a ms before
// its start. Redis runs on this host, and NewLocal's clock is this
// host's, so the test's clock bounds when each decision ran (see
// gcra_exact_test.go).

const (
	refundRaceRate    = 100 // per gcraExactWindow, with a burst of gcraExactBurst
	refundRaceFor     = 3 * time.Second
	refundHammerers   = 40
	refundRefunders   = 24
	refundRaceHeavest = 3
)

// refundedCall is one admitted call, and what its refunds gave back.
type refundedCall struct {
	From, To int64 // Unix ns: when Admit started and returned
	N        int
	Backs    []refundBack
	a        *Admission
}

// refundBack is what one refund gave back, and when it was sent: Back
// as Refund returned it, rounded up, and Exact, the cost it moved the TAT
// back by, in units of weight (the Admission's, in this package).
type refundBack struct {
	Sent  int64
	Back  int
	Exact float64
}

// weightBy is the call's weight as a window ending at b counts it: less
// what the refunds sent by then gave back, exactly.
func (c *refundedCall) weightBy(b int64) float64 {
	w := float64(c.N)
	for _, r := range c.Backs {
		if r.Sent <= b {
			w -= r.Exact
		}
	}
	return w
}

func TestRefundRaceLocal(t *testing.T) {
	b, err := NewLocal(WithStrategy(GCRA), PerResource(Per(refundRaceRate, gcraExactWindow).WithBurst(gcraExactBurst)))
	if err != nil {
		t.Fatal(err)
	}
	refundRace(t, b)
}

func TestRefundRaceRedis(t *testing.T) {
	e := newRealEnv(t, GCRA)
	refundRace(t, e.bucket(t, PerResource(Per(refundRaceRate, gcraExactWindow).WithBurst(gcraExactBurst))))
}

// refundRace runs the adversary on b and checks every window.
func refundRace(t *testing.T, b *Bucket) {
	if testing.Short() {
		t.Skip("an adversary of seconds")
	}
	start := time.Now()
	calls, err := refundAdversary(b, start)
	if err != nil {
		t.Fatal(err)
	}
	checkRefundExact(t, calls, start)
}

// refundAdversary hammers b and refunds from start for refundRaceFor,
// and returns the admitted calls and their refunds.
func refundAdversary(b *Bucket, start time.Time) ([]*refundedCall, error) {
	var (
		mu    sync.Mutex
		calls []*refundedCall
		fails []error
	)
	admitted := make(chan *refundedCall, 1024)
	stop := start.Add(refundRaceFor)
	var hammer, refunders sync.WaitGroup
	for g := range refundHammerers {
		hammer.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(stop) {
				n := 1 + r.IntN(refundRaceHeavest)
				from := time.Now().UnixNano()
				a, res, err := b.Admit(context.Background(), "r", "c", n)
				to := time.Now().UnixNano()
				mu.Lock()
				if err != nil {
					fails = append(fails, err)
				} else if res.Allowed {
					c := &refundedCall{From: from, To: to, N: n, a: a}
					calls = append(calls, c)
					if r.IntN(2) == 0 {
						admitted <- c
					}
				}
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
			}
		})
	}
	for g := range refundRefunders {
		refunders.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 2))
			for c := range admitted {
				// Soon, while most of the call is held; or late, once
				// some or all of it drained (a full bucket drains in
				// 400 ms), which must not come back.
				delay := time.Duration(r.IntN(5000)) * time.Microsecond
				switch r.IntN(3) {
				case 1:
					delay *= 16
				case 2:
					delay *= 120
				}
				time.Sleep(delay)
				for range 1 + r.IntN(2) { // some twice: the second gives less, or nothing
					sent, before := time.Now().UnixNano(), c.a.given[0]
					back, err := b.Refund(context.Background(), c.a, 1+r.IntN(c.N+1))
					// A unit costs Window, 2000 ms, in 1/Rate of a ms.
					exact := float64(c.a.given[0]-before) / float64(gcraExactWindow.Milliseconds())
					mu.Lock()
					if err != nil || exact > float64(back) || float64(back) >= exact+1 {
						fails = append(fails, fmt.Errorf("Refund = %d, %v; it gave back %.3f", back, err, exact))
					}
					c.Backs = append(c.Backs, refundBack{Sent: sent, Back: back, Exact: exact})
					mu.Unlock()
				}
			}
		})
	}
	hammer.Wait()
	close(admitted)
	refunders.Wait()
	if len(fails) > 0 {
		return calls, fmt.Errorf("%d calls failed, the first: %w", len(fails), fails[0])
	}
	return calls, nil
}

// refundRaceVar holds a refundRaceJob: run as a child process of
// TestRefundRaceProcesses.
const refundRaceVar = "LEAKYBUCKET_TEST_REFUND_RACE"

// refundRaceJob is what a child process of the race runs.
type refundRaceJob struct {
	Addr, User, Password, Prefix string
	DB                           int
	Start                        int64 // Unix ns
}

// The adversary from 4 processes on one key of the real Redis: each
// hammers and refunds as TestRefundRaceRedis does, and the windows are
// checked on the calls of all four.
func TestRefundRaceProcesses(t *testing.T) {
	addr := realAddrOrSkip(t)
	if testing.Short() {
		t.Skip("an adversary of seconds, from 4 processes")
	}
	opts := libraryOptions(addr, "gcra", 1)
	job := refundRaceJob{Addr: addr, User: opts.Username, Password: opts.Password, DB: opts.DB, Prefix: uniquePrefix(t),
		Start: time.Now().Add(2 * time.Second).UnixNano()} // time for the children to start
	spec, _ := json.Marshal(job)
	outs := make(chan []byte, 3)
	children := spawnChildren(t, 3, refundRaceVar+"="+string(spec), outs)
	mine, err := job.run()
	children.Wait()
	close(outs)
	if err != nil {
		t.Fatal(err)
	}
	all := mine
	for out := range outs {
		var theirs []*refundedCall
		if err := json.Unmarshal(out, &theirs); err != nil || len(theirs) == 0 {
			t.Errorf("a child admitted nothing, or said: %v\n%s", err, out)
		}
		all = append(all, theirs...)
	}
	checkRefundExact(t, all, time.Unix(0, job.Start))
}

// spawnChildren starts n runs of this test binary with env set, which
// TestMain hands to a child's main, and sends what each prints to outs.
// A child that fails fails the test.
func spawnChildren(t *testing.T, n int, env string, outs chan<- []byte) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			child := exec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), env)
			out, err := child.Output()
			if err != nil {
				t.Errorf("child: %v\n%s", err, out)
			}
			outs <- out
		})
	}
	return &wg
}

// run runs the adversary of one process of the job.
func (job refundRaceJob) run() ([]*refundedCall, error) {
	rdb := redis.NewClient(&redis.Options{Addr: job.Addr, DB: job.DB, Username: job.User, Password: job.Password, PoolSize: 64})
	defer rdb.Close()
	b, err := New(rdb, WithStrategy(GCRA), WithPrefix(job.Prefix), PerResource(Per(refundRaceRate, gcraExactWindow).WithBurst(gcraExactBurst)))
	if err != nil {
		return nil, err
	}
	start := time.Unix(0, job.Start)
	time.Sleep(time.Until(start))
	return refundAdversary(b, start)
}

// refundRaceMain is the body of a child process of the race: it prints
// its calls as JSON and returns the exit code.
func refundRaceMain(spec string) int {
	var job refundRaceJob
	var calls []*refundedCall
	err := json.Unmarshal([]byte(spec), &job)
	if err == nil {
		calls, err = job.run()
	}
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(calls)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// checkRefundExact checks every window [a, b] from a call's start to a
// call's return: the calls that started and returned in it, each weighed
// by weightBy(b), weigh at most burst + what drains in b-a. It also
// checks that no call got back more than it was admitted.
func checkRefundExact(t *testing.T, all []*refundedCall, start time.Time) {
	t.Helper()
	drained := func(ns int64) float64 { return float64(ns) * refundRaceRate / float64(gcraExactWindow) }
	slices.SortFunc(all, func(x, y *refundedCall) int { return cmp.Compare(x.From, y.From) })
	admitted, back, refunds, worst := 0, 0.0, 0, ""
	byEnd := make([]*refundedCall, 0, len(all))
	for i, a := range all {
		admitted += a.N
		for _, r := range a.Backs {
			back, refunds = back+r.Exact, refunds+1
		}
		if w := a.weightBy(1 << 62); w < 0 {
			t.Errorf("a call of %d got %.3f back", a.N, float64(a.N)-w)
		}
		byEnd = append(byEnd[:0], all[i:]...)
		slices.SortFunc(byEnd, func(x, y *refundedCall) int { return cmp.Compare(x.To, y.To) })
		for k, c := range byEnd {
			in := 0.0
			for _, d := range byEnd[:k+1] {
				in += d.weightBy(c.To)
			}
			// Decisions are made at whole ms, floored: the first may be
			// made up to a ms before a's start.
			if most := gcraExactBurst + drained(c.To-a.From+int64(time.Millisecond)); in > most+1e-9 {
				worst = fmt.Sprintf("%.3f admitted in %v, GCRA allows at most %.3f", in, time.Duration(c.To-a.From), most)
			}
		}
	}
	if worst != "" {
		t.Errorf("over-admitted: %s", worst)
	}
	last := start.UnixNano()
	for _, c := range all {
		last = max(last, c.To)
	}
	most := gcraExactBurst + drained(last-start.UnixNano())
	t.Logf("%d calls admitted %d of weight, %d refunds gave back %.1f: %.1f net over %v; GCRA allows at most %.1f (%.1f %%)",
		len(all), admitted, refunds, back, float64(admitted)-back, time.Duration(last-start.UnixNano()), most, 100*(float64(admitted)-back)/most)
}
