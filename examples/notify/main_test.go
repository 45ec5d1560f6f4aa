package main

import (
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
	"github.com/leakybucket/leakybucket/examples/internal/demotest"
)

// Under every strategy, demotest.Runs checks each answer against the calls
// sent before it (DeniedBy must list every cap with no room), and that 100
// are sent in all and 10 of some type, but no more. Here every event is
// accounted for, both caps bite, alone and together, and each event is
// printed as it is answered, under every cap that dropped it.
func TestRun(t *testing.T) {
	rules := []leakybucket.Rule{
		{Limit: leakybucket.Per(allTypes, 30*time.Minute)},
		{PerClient: true, Limit: leakybucket.Per(perType, 30*time.Minute)},
	}
	demotest.Runs(t, run, schedule(), rules, func(t *testing.T, calls []demo.Call, out string) {
		ts := tallies(calls)
		checkTallies(t, calls, ts)
		checkOutput(t, calls, ts, out)
	})
}

// checkTallies checks the tallies against the calls.
func checkTallies(t *testing.T, calls []demo.Call, ts []tally) {
	t.Helper()
	total := ts[eventTypes]
	if total.events != events || total.sent != allTypes || total.sent+total.dropped != events {
		t.Errorf("total %+v, want %d events, %d sent, the rest dropped", total, events, allTypes)
	}
	both := 0
	for _, c := range calls {
		if len(c.Result.DeniedBy) == 2 {
			both++
		}
	}
	if total.byType+total.byTotal-total.dropped != both || both == 0 || total.byType == both || total.byTotal == both {
		t.Errorf("drops %+v with %d calls denied by both caps: want each cap alone and both together, "+
			"a call denied by both counted under both", total, both)
	}
	checkPerType(t, ts)
}

// checkPerType checks each type's tally, and that they add up to the
// total's.
func checkPerType(t *testing.T, ts []tally) {
	t.Helper()
	total := ts[eventTypes]
	sent, dropped := 0, 0
	for i, tl := range ts[:eventTypes] {
		if tl.sent > perType {
			t.Errorf("%s sent %d, over the cap of %d", typeName(i), tl.sent, perType)
		}
		if tl.sent+tl.dropped != tl.events || tl.byType > tl.dropped || tl.byTotal > tl.dropped {
			t.Errorf("%s: %+v does not add up", typeName(i), tl)
		}
		sent, dropped = sent+tl.sent, dropped+tl.dropped
	}
	if sent != total.sent || dropped != total.dropped {
		t.Errorf("per-type sent and dropped add up to %d and %d, want the total's %+v", sent, dropped, total)
	}
}

// checkOutput checks that each event was printed, in order, with its
// answer, and the table's total row.
func checkOutput(t *testing.T, calls []demo.Call, ts []tally, out string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	if len(lines) < len(calls)+1 {
		t.Fatalf("%d lines printed for %d events:\n%s", len(lines), len(calls), out)
	}
	for i, c := range calls {
		if line := lines[i+1]; !printed(line, i, c) { // after the header
			t.Errorf("event %d (%s, %s) printed as %q", i+1, c.Client, answer(c.Result), line)
		}
	}
	total := ts[eventTypes]
	row := fmt.Sprintf("total %d %d %d %d %d", total.events, total.sent, total.dropped, total.byType, total.byTotal)
	found := false
	for _, line := range lines[len(calls)+1:] {
		found = found || strings.Join(strings.Fields(line), " ") == row
	}
	if !found || !strings.Contains(out, "dropped by both caps") {
		t.Errorf("no row %q, or no event dropped by both caps:\n%s", row, out)
	}
}

// printed reports whether line shows the i-th call c: its number, its
// event type and its answer.
func printed(line string, i int, c demo.Call) bool {
	fields := strings.Fields(line)
	return len(fields) >= 3 && fields[0] == fmt.Sprint(i+1) && fields[1] == c.Client &&
		strings.Contains(line, answer(c.Result))
}

func TestUsage(t *testing.T) { demotest.Usage(t, program) }

// TestUsageSaysNoSleep: notify sends one burst, so its -h must not say
// that it sleeps on a real server.
func TestUsageSaysNoSleep(t *testing.T) {
	var out strings.Builder
	fs := flag.NewFlagSet(program.Name, flag.ContinueOnError)
	fs.SetOutput(&out)
	demo.Flags(fs, program)
	_ = fs.Parse([]string{"-h"})
	if strings.Contains(out.String(), "sleeps for real") {
		t.Errorf("-h says the burst sleeps:\n%s", out.String())
	}
}
