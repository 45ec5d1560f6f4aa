package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
)

// The two-process test: two children serve tier "t" (one per-resource
// rule, 20 per 500ms, its limits shared every 200ms) while the parent
// lowers the limit to 5 and raises it to 40 with the ops command's code
// path (run). Each child writes one line per call: when it started and
// ended (Unix ns), whether it was admitted, and the Requests its Result
// was decided by.
const (
	limitsChildVar = "LEAKYBUCKET_LIMITS_CHILD"    // the prefix, in a child
	limitsOutVar   = "LEAKYBUCKET_LIMITS_OUT"      // the child's output file
	limitsStopVar  = "LEAKYBUCKET_LIMITS_STOP"     // when it stops, Unix ns
	limitsStratVar = "LEAKYBUCKET_LIMITS_STRATEGY" // as -strategy takes it
	limitsRefresh  = 200 * time.Millisecond
	limitsWindow   = 500 * time.Millisecond
)

// TestLimitsChild is one child of TestLimitsTwoProcesses.
func TestLimitsChild(t *testing.T) {
	prefix := os.Getenv(limitsChildVar)
	if prefix == "" {
		t.Skip("a child of TestLimitsTwoProcesses")
	}
	stop, err := strconv.ParseInt(os.Getenv(limitsStopVar), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(redisAddrVar), DB: 2})
	defer rdb.Close()
	strategy, err := parseStrategy(os.Getenv(limitsStratVar))
	if err != nil {
		t.Fatal(err)
	}
	tiers, err := leakybucket.NewTiers(rdb, leakybucket.WithPrefix(prefix), leakybucket.WithStrategy(strategy),
		leakybucket.WithSharedLimits(limitsRefresh))
	if err != nil {
		t.Fatal(err)
	}
	if err := tiers.Set("t", leakybucket.PerResource(leakybucket.Per(20, limitsWindow))); err != nil {
		t.Fatal(err)
	}
	out, err := os.Create(os.Getenv(limitsOutVar))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	w := bufio.NewWriter(out)
	defer w.Flush()
	for time.Now().UnixNano() < stop {
		s := time.Now().UnixNano()
		res, err := tiers.Allow(context.Background(), "t", "r", "c")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(w, "%d %d %t %d\n", s, time.Now().UnixNano(), res.Allowed, res.Rules[0].Rule.Limit.Requests)
		time.Sleep(2 * time.Millisecond) // the machine is shared: no need to saturate it
	}
}

// limitsCall is one line of a child's output.
type limitsCall struct {
	start, end int64
	allowed    bool
	limit      int
}

// Two processes serve while the ops command lowers and raises the limit:
// from a refresh interval after each change, every decision of both is
// made by the new limit; each admitted call had room under the limit it
// was decided by, counting every call admitted before it in its window by
// either process, at the old limit too (no count lost); and the raised
// limit admits more than the first one did.
func TestLimitsTwoProcesses(t *testing.T) {
	if os.Getenv(redisAddrVar) == "" {
		t.Skip("needs a real Redis ($" + redisAddrVar + "): the windows expire on its clock")
	}
	for _, strategy := range []string{"logs", "windows:10ms"} {
		t.Run(strategy, func(t *testing.T) { limitsTwoProcesses(t, strategy) })
	}
}

func limitsTwoProcesses(t *testing.T, strategy string) {
	r := newTestRedis(t)
	stop := time.Now().Add(4 * time.Second)
	children := startLimitsChildren(t, r.prefix, strategy, stop)
	waitForTier(t, r, "t")
	time.Sleep(600 * time.Millisecond)
	lowered := runLimitsSet(t, r, strategy, "5/500ms")
	time.Sleep(1200 * time.Millisecond)
	raised := runLimitsSet(t, r, strategy, "40/500ms")
	calls := waitLimitsChildren(t, children)

	mostAfterRaise := 0
	for _, c := range calls {
		want := 0
		switch {
		case c.start >= raised[1]+int64(limitsRefresh):
			want = 40
		case c.start >= lowered[1]+int64(limitsRefresh) && c.end < raised[0]:
			want = 5
		case c.end < lowered[0]:
			want = 20
		}
		if want != 0 && c.limit != want {
			t.Errorf("a call from %v to %v was decided by a limit of %d, want %d (lowered at %v, raised at %v)",
				c.start, c.end, c.limit, want, lowered, raised)
		}
		if !c.allowed {
			continue
		}
		before := admittedBefore(calls, c)
		if before+1 > c.limit {
			t.Errorf("a call admitted from %v to %v had %d admitted before it in its window, at a limit of %d", c.start, c.end, before, c.limit)
		}
		if c.start >= raised[1]+int64(limitsRefresh) {
			mostAfterRaise = max(mostAfterRaise, before+1)
		}
	}
	if mostAfterRaise <= 20 {
		t.Errorf("after the raise, at most %d admitted in a window: the raised limit of 40 was not used", mostAfterRaise)
	}
	t.Logf("%d calls; after the raise, up to %d admitted in a window", len(calls), mostAfterRaise)
}

// admittedBefore counts the calls admitted, by either child, certainly
// before c was counted and certainly within its window: ended before c
// started, started after the window before c's end, less a millisecond
// (Redis counts in whole ms of its clock, this host's). Calls that overlap
// c are left out, so the count is never more than Redis's.
func admittedBefore(calls []limitsCall, c limitsCall) int {
	n := 0
	for _, o := range calls {
		if o.allowed && o.end < c.start && o.start > c.end-int64(limitsWindow-time.Millisecond) {
			n++
		}
	}
	return n
}

// runLimitsSet runs "limits set" as an operator does, and returns when it
// started and when it ended (Unix ns).
func runLimitsSet(t *testing.T, r *testRedis, strategy, limit string) [2]int64 {
	t.Helper()
	began := time.Now().UnixNano()
	code, stdout, stderr := cli("-redis", r.url, "-prefix", r.prefix, "-strategy", strategy, "-resource-limit", limit, "limits", "set", "-tier", "t")
	if code != exitOK {
		t.Fatalf("limits set %s: exit %d, stderr %q", limit, code, stderr)
	}
	if want := "-resource-limit " + limit; !strings.Contains(stdout, want) {
		t.Errorf("limits set printed %q, want it to say %q", stdout, want)
	}
	return [2]int64{began, time.Now().UnixNano()}
}

// waitForTier waits until a child wrote the tier's rules to Redis: it
// serves by then.
func waitForTier(t *testing.T, r *testRedis, tier string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok, err := r.rdb.HExists(context.Background(), r.prefix+":limits", tier).Result(); err == nil && ok {
			return
		}
	}
	t.Fatal("no child wrote the tier's rules to Redis within 5s")
}

type limitsChild struct {
	cmd *exec.Cmd
	out string
}

func startLimitsChildren(t *testing.T, prefix, strategy string, stop time.Time) []limitsChild {
	t.Helper()
	dir := t.TempDir()
	var children []limitsChild
	for i := range 2 {
		c := limitsChild{out: filepath.Join(dir, strconv.Itoa(i))}
		c.cmd = exec.Command(os.Args[0], "-test.run=^TestLimitsChild$", "-test.count=1")
		c.cmd.Env = append(os.Environ(), limitsChildVar+"="+prefix, limitsOutVar+"="+c.out, limitsStratVar+"="+strategy,
			limitsStopVar+"="+strconv.FormatInt(stop.UnixNano(), 10))
		c.cmd.Stdout, c.cmd.Stderr = os.Stderr, os.Stderr
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children = append(children, c)
	}
	return children
}

// waitLimitsChildren waits for the children and returns their calls.
func waitLimitsChildren(t *testing.T, children []limitsChild) []limitsCall {
	t.Helper()
	var calls []limitsCall
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		data, err := os.ReadFile(c.out)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(data)) {
			var call limitsCall
			if _, err := fmt.Sscan(line, &call.start, &call.end, &call.allowed, &call.limit); err != nil {
				t.Fatalf("child %d wrote %q: %v", i, line, err)
			}
			calls = append(calls, call)
		}
	}
	return calls
}

// limits set, get and show, as an operator runs them: bad input exits 2
// and writes nothing; a change is printed as the flags that make it.
func TestLimitsCommands(t *testing.T) {
	r := newTestRedis(t)
	ctx := context.Background()
	g := []string{"-redis", r.url, "-prefix", r.prefix}
	tiers, err := leakybucket.NewTiers(r.rdb, leakybucket.WithPrefix(r.prefix), leakybucket.WithSharedLimits(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := tiers.Set("pro", leakybucket.PerClient(leakybucket.PerMinute(10)), leakybucket.PerResource(leakybucket.PerHour(100))); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-client-limit", "5/1m", "-resource-limit", "50/1h", "limits", "set", "-tier", "pro"}, // before any process wrote it
		{"-client-limit", "5/1m", "-resource-limit", "50/1h", "limits", "set"},
		{"limits", "set", "-tier", "pro"},
		{"limits", "get"},
		{"limits", "get", "-tier", "pro"},
	} {
		if code, _, stderr := cli(append(g, args...)...); code != exitUsage {
			t.Errorf("%q: exit %d (%s), want %d", args, code, stderr, exitUsage)
		}
	}
	if _, err := tiers.Allow(ctx, "pro", "r", "c"); err != nil { // its first read writes the tier
		t.Fatal(err)
	}
	hash := func() map[string]string { return r.rdb.HGetAll(ctx, r.prefix+":limits").Val() }
	before := hash()
	for _, args := range [][]string{
		{"-client-limit", "5/1m", "limits", "set", "-tier", "pro"},
		{"-client-limit", "5/2m", "-resource-limit", "50/1h", "limits", "set", "-tier", "pro"},
		{"-resource-limit", "50/1h", "-client-limit", "5/1m", "limits", "set", "-tier", "pro"},
		{"-client-limit", "5/1m", "-resource-limit", "50/1h", "limits", "set", "-tier", "gold"},
		{"-strategy", "gcra", "-client-limit", "5/1m", "-resource-limit", "50/1h", "limits", "set", "-tier", "pro"},
		{"-client-limit", "0/1m", "-resource-limit", "50/1h", "limits", "set", "-tier", "pro"},
	} {
		if code, _, stderr := cli(append(g, args...)...); code != exitUsage {
			t.Errorf("%q: exit %d (%s), want %d", args, code, stderr, exitUsage)
		}
	}
	if after := hash(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("refused changes wrote %v, was %v", after, before)
	}
	set := append(g, "-client-limit", "5/1m", "-resource-limit", "50/1h", "limits", "set", "-tier", "pro")
	if code, stdout, stderr := cli(set...); code != exitOK || stdout != "tier \"pro\": -client-limit 5/1m -resource-limit 50/1h\n" {
		t.Errorf("limits set: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for _, args := range [][]string{{"limits", "get", "-tier", "pro"}, {"limits", "show"}} {
		code, stdout, stderr := cli(append(g, args...)...)
		if code != exitOK || !strings.Contains(stdout, "pro   -client-limit 5/1m -resource-limit 50/1h") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if code, stdout, _ := cli("help", "limits", "set"); code != exitOK || !strings.Contains(stdout, "limits set -tier T") {
		t.Errorf("help limits set: exit %d, stdout %q", code, stdout)
	}
}
