package leakybucket

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// The adversary's test of refunds: hammerers Admit weights of 1 to 3 on
// one key while refunders give back random parts of random admissions, a
// few ms later. Every window [a, b] from a call's start to a call's
// return may hold at most burst + what drains in b-a, counting each call
// that started and returned in it at its weight less what its refunds
// gave back, for refunds sent by b (a refund applies before its reply,
// at the earliest when it is sent; before it is sent, the call counts in
// full), exactly: the fraction of a unit a refund gives back (Refund
// rounds it up) is read from the Admission. Decisions are made at whole ms of the clock, so a window's
// first decision may be up to a ms before its start. Redis runs on this host, and NewLocal's clock is this host's, so
// the test's clock bounds when each decision ran (see gcra_exact_test.go).

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
	a        *Admission
	backs    []refundBack
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
	for _, r := range c.backs {
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
	var (
		mu    sync.Mutex
		calls []*refundedCall
		fails []error
	)
	admitted := make(chan *refundedCall, 1024)
	start := time.Now()
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
					c.backs = append(c.backs, refundBack{Sent: sent, Back: back, Exact: exact})
					mu.Unlock()
				}
			}
		})
	}
	hammer.Wait()
	close(admitted)
	refunders.Wait()
	if len(fails) > 0 {
		t.Fatalf("%d calls failed, the first: %v", len(fails), fails[0])
	}
	checkRefundExact(t, calls, start)
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
		for _, r := range a.backs {
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
