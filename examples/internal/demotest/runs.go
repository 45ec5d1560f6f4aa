package demotest

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"reflect"
	"slices"
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
//   - and what check says of each run's calls and output.
func Runs(t *testing.T, run demo.Run, schedule []demo.Call, rules []leakybucket.Rule, check func(t *testing.T, calls []demo.Call, out string)) {
	if d, a, b := closestToEdge(schedule, rules); d < EdgeMargin {
		t.Errorf("calls at %v and %v are %v from a window's edge: on a real server, latency could flip the answer", a, b, d)
	}
	for _, name := range demo.Strategies {
		t.Run(name, func(t *testing.T) {
			rdb, sleep := demo.Embedded(miniredis.RunT(t))
			defer rdb.Close()
			var slack time.Duration
			if name == "windows" {
				slack = demo.Precision
			}
			var first []demo.Call
			for round := 1; round <= 2; round++ {
				if round == 2 && len(first) > 0 {
					// Where the first run left the clock, moved on to
					// a whole interval of Windows, as at the start.
					sleep(demo.Precision - first[len(first)-1].At%demo.Precision)
				}
				t.Run(fmt.Sprint("run ", round), func(t *testing.T) {
					var out bytes.Buffer
					calls, err := run(context.Background(), demo.Env{Redis: rdb, Sleep: sleep, Strategy: name, Out: &out})
					if err != nil {
						t.Fatal(err)
					}
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
					check(t, calls, out.String())
					if round == 1 {
						first = calls
					} else if !reflect.DeepEqual(calls, first) {
						t.Errorf("the second run differs from the first:\n%s", out.String())
					}
				})
			}
		})
	}
}

// Most returns the most weight admitted in any one window of rule, in any
// of its counts: all the calls' for a per-resource rule, each client's for
// a per-client one. Unlike Verify, it only looks at what was admitted.
func Most(calls []demo.Call, rule leakybucket.Rule) int {
	if rule.Scope == leakybucket.ScopeResource {
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
