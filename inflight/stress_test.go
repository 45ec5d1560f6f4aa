package inflight

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The stress test: 4 processes of 50 goroutines each acquire random
// weights (1 to 3) under a limit of 10 and hold each for 200 to 400 ms.
// Every goroutine records when it asked, when its lease was granted (the
// reply) and when it called Release, on the host's wall clock, which all
// processes share. From these intervals the parent checks that no set of
// holders whose granted-to-release spans all overlap weighs more than 10,
// and that while someone waited, at least 8 were held 90 % of the time.
//
// It runs for $INFLIGHT_STRESS_SECONDS (3 s in make test; the property is
// the same at 30 s: `INFLIGHT_STRESS_SECONDS=30 go test -run Stress`).

const (
	stressLimit      = 10
	stressProcs      = 4
	stressGoroutines = 50
	childVar         = "INFLIGHT_STRESS_CHILD" // set in a child: "redis" or "cluster"
)

func stressDuration() time.Duration { return secondsOf("INFLIGHT_STRESS_SECONDS", 3*time.Second) }

// secondsOf is the whole seconds in the environment variable name, or def.
func secondsOf(name string, def time.Duration) time.Duration {
	if s, err := strconv.Atoi(os.Getenv(name)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return def
}

// span is one acquisition: asked, granted and released in unix ns.
type span struct {
	asked, granted, released int64
	weight                   int
}

func TestStressProcesses(t *testing.T) {
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			v := redisAddrVar
			if kind == "cluster" {
				v = clusterAddrsVar
			}
			needAddr(t, v)
			// Occupancy depends on the machine: the handoff takes round
			// trips, which a host loaded many times over its cores
			// stretches. A run whose occupancy fell short is run again
			// (at most 3 runs); the limit is checked in every run.
			for run := 1; !checkSpans(t, stressProcesses(t, kind), run == 3); run++ {
				t.Logf("run %d: occupancy short; again", run)
				if run == 3 {
					break
				}
			}
		})
	}
	t.Run("local", func(t *testing.T) {
		l, _ := NewLocal(PerResource(stressLimit))
		checkSpans(t, stressRun(t, l, stressProcs*stressGoroutines), true)
	})
}

// stressProcesses runs the child processes on the kind of server, and
// returns their spans.
func stressProcesses(t *testing.T, kind string) []span {
	// Every child starts at once, its connections made: the
	// property is about the limiter, not process start-up.
	start := time.Now().Add(time.Second).UnixNano()
	var spans []span
	for _, out := range runChildren(t, "TestStressChild", stressProcs, childVar+"="+kind, "INFLIGHT_START="+strconv.FormatInt(start, 10)) {
		spans = append(spans, readSpans(t, out)...)
	}
	return spans
}

// runChildren runs n child processes of the test binary, each running the
// test named run, with env added to this process's environment, a prefix
// of their own (INFLIGHT_PREFIX) and a file of its own to write
// (INFLIGHT_OUT); it returns those files' paths once every child is done.
func runChildren(t *testing.T, run string, n int, env ...string) []string {
	dir := t.TempDir()
	env = append(append(os.Environ(), env...), "INFLIGHT_PREFIX="+uniquePrefix())
	var cmds []*exec.Cmd
	var outs []string
	for i := range n {
		outs = append(outs, filepath.Join(dir, strconv.Itoa(i)))
		cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
		cmd.Env = append(slices.Clone(env), "INFLIGHT_OUT="+outs[i])
		cmd.Stderr, cmd.Stdout = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	return outs
}

// childClient is a child process's client of the server of kind
// ("redis" or "cluster"), with a pool of pool connections.
func childClient(kind string, pool int) redis.UniversalClient {
	if kind == "cluster" {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(os.Getenv(clusterAddrsVar), ","), PoolSize: pool})
	}
	return redis.NewClient(&redis.Options{Addr: os.Getenv(redisAddrVar), PoolSize: pool})
}

// TestStressChild is one child process of TestStressProcesses.
func TestStressChild(t *testing.T) {
	kind := os.Getenv(childVar)
	if kind == "" {
		t.Skip("a child of TestStressProcesses")
	}
	rdb := childClient(kind, 4*stressGoroutines)
	defer rdb.Close()
	l, err := New(rdb, PerResource(stressLimit), WithPrefix(os.Getenv("INFLIGHT_PREFIX")))
	if err != nil {
		t.Fatal(err)
	}
	childReady(t, rdb, l, stressGoroutines, "stress")
	spans := stressRun(t, l, stressGoroutines)
	writeOut(t, func(w io.Writer) {
		for _, s := range spans {
			fmt.Fprintf(w, "%d %d %d %d\n", s.asked, s.granted, s.released, s.weight)
		}
	})
}

// childReady readies a child process: its pool filled for goroutines, its
// clock sampled by a call on resource, it waits until $INFLIGHT_START, when
// every child starts at once.
func childReady(t *testing.T, rdb redis.UniversalClient, l *Limiter, goroutines int, resource string) {
	var wg sync.WaitGroup
	for range goroutines { // fill the pool
		wg.Go(func() { _ = rdb.Ping(context.Background()).Err() })
	}
	wg.Wait()
	if _, err := l.Held(context.Background(), resource); err != nil {
		t.Fatal(err)
	}
	start, _ := strconv.ParseInt(os.Getenv("INFLIGHT_START"), 10, 64)
	time.Sleep(time.Until(time.Unix(0, start)))
}

// writeOut writes a child's output file, $INFLIGHT_OUT, with write.
func writeOut(t *testing.T, write func(w io.Writer)) {
	f, err := os.Create(os.Getenv("INFLIGHT_OUT"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	write(w)
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// stressRun runs goroutines that acquire and release until the stress
// duration has passed, and returns their spans.
func stressRun(t *testing.T, l *Limiter, goroutines int) []span {
	end := time.Now().Add(stressDuration())
	var mu sync.Mutex
	var spans []span
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for time.Now().Before(end) {
				s := span{weight: 1 + rand.IntN(3), asked: time.Now().UnixNano()}
				ctx, cancel := context.WithDeadline(context.Background(), end)
				le, err := l.AcquireN(ctx, "stress", "c", s.weight)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					return
				}
				if err != nil {
					t.Errorf("AcquireN: %v", err)
					return
				}
				s.granted = time.Now().UnixNano()
				time.Sleep(time.Duration(200+rand.IntN(200)) * time.Millisecond)
				s.released = time.Now().UnixNano()
				if err := le.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
				mu.Lock()
				spans = append(spans, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return spans
}

func readSpans(t *testing.T, path string) []span {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []span
	for line := range strings.Lines(string(data)) {
		var s span
		if _, err := fmt.Sscan(line, &s.asked, &s.granted, &s.released, &s.weight); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		out = append(out, s)
	}
	return out
}

// checkSpans checks the spans' two properties, by a sweep over their
// ends: at equal instants a grant counts before a release, so touching
// spans count as overlapping. It fails the test if more than the limit
// was held; it reports whether occupancy was met, and fails the test on
// a short one if last.
func checkSpans(t *testing.T, spans []span, last bool) bool {
	t.Helper()
	type event struct {
		at            int64
		held, waiting int
	}
	var evs []event
	for _, s := range spans {
		evs = append(evs, event{s.asked, 0, 1}, event{s.granted, s.weight, -1}, event{s.released, -s.weight, 0})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return b.held - a.held // grants first
	})
	held, waiting, most := 0, 0, 0
	var withWaiters, full time.Duration
	low := map[int64]time.Duration{}
	for i, e := range evs {
		held += e.held
		waiting += e.waiting
		most = max(most, held)
		if i+1 < len(evs) && waiting > 0 {
			d := time.Duration(evs[i+1].at - e.at)
			withWaiters += d
			if held >= stressLimit-2 {
				full += d
			} else {
				low[(e.at-evs[0].at)/int64(250*time.Millisecond)] += d
			}
		}
	}
	if os.Getenv("INFLIGHT_DEBUG") != "" {
		t.Logf("time under %d per 250 ms: %v", stressLimit-2, low)
	}
	t.Logf("%d acquisitions; at most %d held; with waiters %v, of which %.1f%% with at least %d held",
		len(spans), most, withWaiters, 100*float64(full)/float64(max(withWaiters, 1)), stressLimit-2)
	if most > stressLimit {
		t.Errorf("%d held at once, limit %d", most, stressLimit)
	}
	short := len(spans) == 0 || float64(full) < 0.9*float64(withWaiters)
	if short && last && !raceEnabled {
		t.Errorf("with waiters, at least %d held only %v of %v", stressLimit-2, full, withWaiters)
	}
	return !short || raceEnabled
}
