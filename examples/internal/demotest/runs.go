package demotest

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

// Runs runs a program twice under every strategy, on an embedded miniredis
// whose clock only the program's sleeps move, and checks each run: that
// it made the calls of schedule under rules, that Verify finds nothing wrong (within
// demo.Precision for the windows strategy), that the second run repeats
// the first (each forgets the counts of the one before), that some
// window of each rule holds all it allows but none more (see Most): a demo
// whose limits never bite shows nothing, and what check says of its calls
// and output.
func Runs(t *testing.T, run demo.Run, schedule []demo.Call, rules []leakybucket.Rule, check func(t *testing.T, calls []demo.Call, out string)) {
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
						if most := Most(calls, rr.Rule); most != rr.Rule.Limit.Requests {
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
