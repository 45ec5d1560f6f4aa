package main

import (
	"strings"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
	"github.com/leakybucket/leakybucket/examples/internal/demotest"
)

// Under every strategy, demotest.Runs checks each answer against the
// batches allowed before it, and that some window of each rule holds as
// many items as it allows, but none more. Here the second's, then the
// minute's, then the hour's rule is the one that denies alone.
func TestRun(t *testing.T) {
	var want []leakybucket.Rule
	for _, l := range []leakybucket.Limit{leakybucket.PerSecond(10), leakybucket.PerMinute(120), leakybucket.PerHour(240)} {
		want = append(want, leakybucket.Rule{PerClient: true, Limit: l})
	}
	demotest.Runs(t, run, schedule(), want, func(t *testing.T, calls []demo.Call, out string) {
		// When each rule first denied alone: in the order of rules.
		var firstAlone []time.Duration
		for _, r := range rules {
			for _, c := range calls {
				if len(c.Result.DeniedBy) == 1 && c.Result.DeniedBy[0].Limit == r.limit {
					firstAlone = append(firstAlone, c.At)
					break
				}
			}
		}
		if len(firstAlone) != len(rules) || firstAlone[0] >= firstAlone[1] || firstAlone[1] >= firstAlone[2] {
			t.Errorf("rules first denied alone at %v, want the second's, the minute's, the hour's in turn", firstAlone)
		}
		if !strings.Contains(out, "denied per hour") || !strings.Contains(out, "in all:") {
			t.Errorf("no hour's denial or no summary:\n%s", out)
		}
	})
}

func TestUsage(t *testing.T) { demotest.Usage(t, program) }
