package main

import (
	"strings"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
	"github.com/leakybucket/leakybucket/examples/internal/demotest"
)

// Under every strategy, demotest.Runs checks each answer against the calls
// allowed before it, and that some 10 seconds see 5 calls allowed in all,
// and 3 from one consumer, but none more. Here both limits deny, alone and
// together.
func TestRun(t *testing.T) {
	rules := []leakybucket.Rule{
		{Limit: leakybucket.Per(5, 10*time.Second)},
		{PerClient: true, Limit: leakybucket.Per(3, 10*time.Second)},
	}
	demotest.Runs(t, run, schedule(), rules, func(t *testing.T, calls []demo.Call, out string) {
		answers := map[string]int{}
		for _, c := range calls {
			answers[answer(c.Result)]++
		}
		for _, a := range []string{"allowed", "denied by the API's limit", "denied by its own limit", "denied by both limits"} {
			if answers[a] == 0 {
				t.Errorf("no call was %s: %v", a, answers)
			}
		}
		if !strings.Contains(out, "most allowed in 10s") {
			t.Errorf("no summary:\n%s", out)
		}
	})
}

func TestUsage(t *testing.T) { demotest.Usage(t, program) }
