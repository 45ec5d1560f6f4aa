package demotest

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

// EdgeMargin is how far a demo's calls stay from the edge of another
// call's window, so that the few ms by which a real server's calls land
// late cannot change the answers: a window of w counts a call made at a
// from a to a+w.
const EdgeMargin = 100 * time.Millisecond

// closestToEdge returns the least distance between a call of schedule and
// the end of any rule's window that starts with an earlier call, and those
// two calls.
func closestToEdge(schedule []demo.Call, rules []leakybucket.Rule) (least, a, b time.Duration) {
	least = time.Duration(math.MaxInt64)
	for i, first := range schedule {
		for _, second := range schedule[i+1:] {
			for _, r := range rules {
				if d := (second.At - first.At - r.Limit.Window).Abs(); d < least {
					least, a, b = d, first.At, second.At
				}
			}
		}
	}
	return least, a, b
}

// Runs runs a program twice under every strategy, on an embedded miniredis
// whose clock only the program's sleeps move, and checks:
//
//   - that schedule keeps EdgeMargin;
//   - that each run made the calls of schedule, under rules;
//   - that Verify finds nothing wrong in them (within demo.Precision for
//     the windows strategy);
//   - that no window of a rule holds more than it allows (see Most), and
//     under the exact strategies that some window holds all of it: a demo
//     whose limits never fill shows little (Windows, which may deny early,
//     can fall short);
//   - that the second run repeats the first: each forgets the counts of
//     the one before;
//   - that the program printed something of each call before making the
//     next (progress as it happens, not only a summary at the end), and
//     that no line of its output is wider than Columns;
//   - and what check says of each run's calls and output.
func Runs(t *testing.T, run demo.Run, schedule []demo.Call, rules []leakybucket.Rule, check func(t *testing.T, calls []demo.Call, out string)) {
	if d, a, b := closestToEdge(schedule, rules); d < EdgeMargin {
		t.Errorf("calls at %v and %v are %v from a window's edge: on a real server, latency could flip the answer", a, b, d)
	}
	for _, name := range demo.Strategies {
		t.Run(name, func(t *testing.T) { runTwice(t, name, run, schedule, rules, check) })
	}
}

// runTwice runs the program twice under the strategy name, checks each
// run, and that the second repeats the first.
func runTwice(t *testing.T, name string, run demo.Run, schedule []demo.Call, rules []leakybucket.Rule, check func(t *testing.T, calls []demo.Call, out string)) {
	rdb, sleep := demo.Embedded(miniredis.RunT(t))
	defer rdb.Close()
	var slack time.Duration
	if name == "windows" {
		slack = demo.Precision
	}
	var first []demo.Call
	for round := 1; round <= 2; round++ {
		if round == 2 && len(first) > 0 {
			// Where the first run left the clock, moved on to a whole
			// interval of Windows, as at the start.
			sleep(demo.Precision - first[len(first)-1].At%demo.Precision)
		}
		t.Run(fmt.Sprint("run ", round), func(t *testing.T) {
			var out bytes.Buffer
			calls, err := run(context.Background(), demo.Env{Redis: rdb, Sleep: progress(t, &out, sleep), Strategy: name, Out: &out})
			if err != nil {
				t.Fatal(err)
			}
			checkRun(t, calls, out.String(), schedule, rules, slack)
			check(t, calls, out.String())
			if round == 1 {
				first = calls
			} else if !reflect.DeepEqual(calls, first) {
				t.Errorf("the second run differs from the first:\n%s", out.String())
			}
		})
	}
}

// checkRun checks one run: its output's width, that it made the calls of
// schedule under rules, that Verify finds nothing wrong in them, and that
// no window of a rule holds more than it allows (under the exact
// strategies, that some window holds all of it).
func checkRun(t *testing.T, calls []demo.Call, out string, schedule []demo.Call, rules []leakybucket.Rule, slack time.Duration) {
	t.Helper()
	checkWidth(t, out)
	if len(calls) != len(schedule) {
		t.Fatalf("made %d calls, want %d", len(calls), len(schedule))
	}
	for _, err := range Verify(calls, slack) {
		t.Error(err)
	}
	for _, c := range calls {
		if got := ruleList(c.Result); !slices.Equal(got, rules) {
			t.Fatalf("%v: the rules are %v, want %v", c.At, got, rules)
		}
	}
	for _, rr := range calls[0].Result.Rules {
		most := Most(calls, rr.Rule)
		if most > rr.Rule.Limit.Requests || slack == 0 && most < rr.Rule.Limit.Requests {
			t.Errorf("at most %d admitted within one window of %v, want its limit", most, rr.Rule)
		}
	}
}

// Columns is the widest a line of a program's output may be.
const Columns = 100

// progress returns env.Sleep for a run printing to out: demo.Play sleeps
// before each call, so from the second sleep on, the call before must have
// printed something.
func progress(t *testing.T, out *bytes.Buffer, sleep func(time.Duration)) func(time.Duration) {
	calls, printed := 0, 0
	return func(d time.Duration) {
		if calls > 0 && out.Len() == printed {
			t.Errorf("call %d printed nothing before the next call was made", calls)
		}
		calls, printed = calls+1, out.Len()
		sleep(d)
	}
}

// checkWidth fails t if a line of out is wider than Columns (a tab counts
// as the spaces to the next multiple of 8).
func checkWidth(t *testing.T, out string) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if w := width(line); w > Columns {
			t.Errorf("line %d is %d columns wide, more than %d:\n%s", i+1, w, Columns, line)
		}
	}
}

func width(line string) int {
	w := 0
	for _, r := range line {
		if r == '\t' {
			w += 8 - w%8
			continue
		}
		w++
	}
	return w
}

// Usage checks what -h prints for p: p's text, every flag, REDIS_URL and
// how long a run on a real server takes, within Columns.
func Usage(t *testing.T, p demo.Program) {
	t.Helper()
	fs := flag.NewFlagSet(p.Name, flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	demo.Flags(fs, p)
	if err := fs.Parse([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
	usage := out.String()
	checkWidth(t, usage)
	want := []string{"go run ./examples/" + p.Name, p.About, "REDIS_URL", "redis://", p.Real}
	fs.VisitAll(func(f *flag.Flag) { want = append(want, "-"+f.Name, f.Usage) })
	for _, w := range want {
		if !strings.Contains(usage, w) {
			t.Errorf("-h does not say %q:\n%s", w, usage)
		}
	}
}

// Most returns the most weight admitted in any one window of rule, in any
// of its counts: all the calls' for a per-resource rule, each client's for
// a per-client one. Unlike Verify, it only looks at what was admitted.
func Most(calls []demo.Call, rule leakybucket.Rule) int {
	if !rule.PerClient {
		return demo.MostInWindow(calls, "", rule.Limit.Window)
	}
	most := 0
	for _, c := range calls {
		most = max(most, demo.MostInWindow(calls, c.Client, rule.Limit.Window))
	}
	return most
}

func ruleList(res leakybucket.Result) []leakybucket.Rule {
	var rules []leakybucket.Rule
	for _, rr := range res.Rules {
		rules = append(rules, rr.Rule)
	}
	return rules
}
