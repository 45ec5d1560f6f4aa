package inflight

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The contention test: the short waits of a middleware, from several
// processes. 4 processes of 25 goroutines each call AcquireWithin with a
// weight of 1 to 3 under PerResource(6), waiting 20 ms, 200 ms or 2 s,
// hold a lease 5 to 15 ms, and release it. Each lease's span runs from
// AcquireWithin's return to the call of Release (a lower bound of what
// Redis held), on the host's wall clock, which every process shares. The
// parent checks that no more than 6 were held at once, that 80 % of the
// limit was held on average over the run, and that no process was served
// less than half the mean process.
//
// It runs for $INFLIGHT_CONTENTION_SECONDS a wait (2 s in make test).
// The share and the fairness are issue #52's targets, met in most runs,
// not all, on this 2-core machine with other work on it (docs/inflight.md
// and the CHANGELOG say what was measured): make test checks the limit
// in every run and logs the rest; a run with INFLIGHT_CONTENTION_SECONDS
// set (the issue's, 6 s) checks the targets too.

const (
	contentionLimit      = 6
	contentionProcs      = 4
	contentionGoroutines = 25
	contentionVar        = "INFLIGHT_CONTENTION_CHILD" // set in a child: "redis" or "cluster"
)

// targetsChecked reports whether this run checks issue #52's share and
// fairness targets: only the run, which sets its length.
func targetsChecked() bool { return os.Getenv("INFLIGHT_CONTENTION_SECONDS") != "" }

func contentionDuration() time.Duration {
	return secondsOf("INFLIGHT_CONTENTION_SECONDS", 2*time.Second)
}

var contentionWaits = []time.Duration{20 * time.Millisecond, 200 * time.Millisecond, 2 * time.Second}

// held is one lease a contention child held: from AcquireWithin's return
// to Release's call (unix ns), and by which process.
type held struct {
	granted, released int64
	weight, proc      int
}

func TestContentionProcesses(t *testing.T) {
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			v := redisAddrVar
			if kind == "cluster" {
				v = clusterAddrsVar
			}
			needAddr(t, v)
			for _, wait := range contentionWaits {
				t.Run(wait.String(), func(t *testing.T) {
					// As in TestStressProcesses: a run whose share fell short
					// (a host loaded many times over stretches every
					// handoff) is run again, 3 runs at most; the limit is
					// checked in every run.
					for run := 1; ; run++ {
						from, to, leases := contentionProcesses(t, kind, wait)
						if checkContention(t, from, to, leases, run == 3) || run == 3 {
							break
						}
						t.Logf("run %d short; again", run)
					}
				})
			}
		})
	}
}

// contentionProcesses runs the child processes on the kind of server,
// and returns the span of the run and the leases held.
func contentionProcesses(t *testing.T, kind string, wait time.Duration) (from, to int64, leases []held) {
	from = time.Now().Add(time.Second).UnixNano() // every child starts at once, connected
	to = from + contentionDuration().Nanoseconds()
	outs := runChildren(t, "TestContentionChild", contentionProcs, contentionVar+"="+kind,
		"INFLIGHT_START="+strconv.FormatInt(from, 10), "INFLIGHT_END="+strconv.FormatInt(to, 10), "INFLIGHT_WAIT="+wait.String())
	for i, out := range outs {
		leases = append(leases, readHeld(t, out, i)...)
	}
	return from, to, leases
}

// TestContentionChild is one child process of TestContentionProcesses.
func TestContentionChild(t *testing.T) {
	kind := os.Getenv(contentionVar)
	if kind == "" {
		t.Skip("a child of TestContentionProcesses")
	}
	rdb := childClient(kind, 4*contentionGoroutines)
	defer rdb.Close()
	l, err := New(rdb, PerResource(contentionLimit), WithPrefix(os.Getenv("INFLIGHT_PREFIX")))
	if err != nil {
		t.Fatal(err)
	}
	to, _ := strconv.ParseInt(os.Getenv("INFLIGHT_END"), 10, 64)
	wait, _ := time.ParseDuration(os.Getenv("INFLIGHT_WAIT"))
	childReady(t, rdb, l, contentionGoroutines, "res")
	leases, ranOut := contentionRun(t, l, wait, time.Unix(0, to))
	t.Logf("%d leases, %d waits ran out", len(leases), ranOut)
	writeOut(t, func(w io.Writer) {
		for _, h := range leases {
			fmt.Fprintf(w, "%d %d %d\n", h.granted, h.released, h.weight)
		}
	})
}

// contentionRun runs the goroutines of one process until end, and
// returns the leases they held and how many waits ran out.
func contentionRun(t *testing.T, l *Limiter, wait time.Duration, end time.Time) ([]held, int) {
	var mu sync.Mutex
	var leases []held
	ranOut := 0
	var wg sync.WaitGroup
	for range contentionGoroutines {
		wg.Go(func() {
			for time.Now().Before(end) {
				h := held{weight: 1 + rand.IntN(3)}
				le, err := l.AcquireWithin(context.Background(), "res", "c", h.weight, wait)
				if err != nil {
					t.Errorf("AcquireWithin: %v", err)
					return
				}
				if le == nil {
					mu.Lock()
					ranOut++
					mu.Unlock()
					continue
				}
				h.granted = time.Now().UnixNano()
				time.Sleep(time.Duration(5+rand.IntN(11)) * time.Millisecond)
				h.released = time.Now().UnixNano()
				if err := le.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
				mu.Lock()
				leases = append(leases, h)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return leases, ranOut
}

func readHeld(t *testing.T, path string, proc int) []held {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []held
	for line := range strings.Lines(string(data)) {
		h := held{proc: proc}
		if _, err := fmt.Sscan(line, &h.granted, &h.released, &h.weight); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		out = append(out, h)
	}
	return out
}

// checkContention checks the run's properties: it fails the test if more
// than the limit was held at once (touching spans count as overlapping);
// it reports whether the share held and the fairness were met, and fails
// the test on a shortfall if last. The share is the weight held, summed
// over time from the run's start to its end, over the limit's.
func checkContention(t *testing.T, from, to int64, leases []held, last bool) bool {
	t.Helper()
	served := make([]int, contentionProcs)
	for _, h := range leases {
		served[h.proc]++
	}
	most, area := sweepHeld(leases, from, to)
	share := area / (float64(contentionLimit) * float64(to-from))
	mean := float64(len(leases)) / contentionProcs
	least := slices.Min(served)
	t.Logf("%d leases (%.0f/s), per process %v; at most %d held; %.1f%% of the limit held on average",
		len(leases), float64(len(leases))/time.Duration(to-from).Seconds(), served, most, 100*share)
	if most > contentionLimit {
		t.Errorf("%d held at once, limit %d", most, contentionLimit)
	}
	ok := share >= 0.8 && float64(least) >= mean/2
	if !targetsChecked() {
		return true
	}
	if !ok && last && !raceEnabled {
		t.Errorf("%.1f%% of the limit held on average (want at least 80%%); the least served process had %d leases, the mean %.0f (want at least half)",
			100*share, least, mean)
	}
	return ok || raceEnabled
}

// sweepHeld returns the most weight held at once (at equal instants a
// grant counts before a release) and the weight held summed over time
// within [from, to] (weight x ns).
func sweepHeld(leases []held, from, to int64) (int, float64) {
	type event struct {
		at     int64
		weight int
	}
	var evs []event
	for _, h := range leases {
		evs = append(evs, event{h.granted, h.weight}, event{h.released, -h.weight})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return b.weight - a.weight // grants first
	})
	heldNow, most, area := 0, 0, 0.0
	for i, e := range evs {
		heldNow += e.weight
		most = max(most, heldNow)
		if i+1 < len(evs) {
			if a, b := max(e.at, from), min(evs[i+1].at, to); b > a {
				area += float64(heldNow) * float64(b-a)
			}
		}
	}
	return most, area
}
