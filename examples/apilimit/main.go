// Command apilimit is an API limit of three windows at once: a tenant may
// send 10 items a second, 120 a minute and 240 an hour, and a batch of n
// items costs n (AllowN). The tenant sends a fast burst, then a steady
// trickle, for three minutes, so that the second's, then the minute's,
// then the hour's limit is the one that denies. apilimit prints each batch
// as it is answered, with the rules that denied it (Result.DeniedBy) and
// each rule's count (Result.Rules), and then a summary per rule.
//
// It runs on an embedded miniredis by default, whose clock is simulated so
// the three minutes pass at once, and on a real server when REDIS_URL is
// set (redis://host:port/db), where it takes the three minutes. It forgets
// the previous run's counts first, so every run starts from empty windows.
//
//	go run ./examples/apilimit [-strategy logs|sortedset|windows]
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/apilimit
package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

const (
	endpoint = "POST /v1/items:batch" // the resource
	tenant   = "tenant-7"             // the client
	duration = 3 * time.Minute        // of sending
)

// The tenant's pace: a burst of batches of 3 to 7 items, then a trickle of
// batches of 1 to 5. No batch is due within 100ms of the end of another's
// window (1s, 1m, 1h), so on a real server, where calls land a few ms late,
// the answers are those of the simulated clock.
const (
	burst, burstEvery     = 18 * time.Second, 400 * time.Millisecond
	trickle, trickleEvery = 18100 * time.Millisecond, 2200 * time.Millisecond
)

// rules are the tenant's limits, all per-client, with their names.
var rules = []struct {
	name  string
	limit leakybucket.Limit
}{
	{"per second", leakybucket.PerSecond(10)},
	{"per minute", leakybucket.PerMinute(120)},
	{"per hour", leakybucket.PerHour(240)},
}

// program is what -h says.
var program = demo.Program{
	Name: "apilimit",
	About: `A tenant may send 10 items a second, 120 a minute and 240 an hour, and a batch
of n items costs n. It sends a fast burst, then a steady trickle, for three
minutes, so that the second's, then the minute's, then the hour's limit is the
one that denies. It prints each batch as it is answered (which limits denied
it, its Retry-After, and each limit's count), then a summary per limit.`,
	Real: "the program sleeps for real: it takes 3 minutes",
}

func main() {
	demo.Main(program, func(where, strategy string) string {
		return fmt.Sprintf("apilimit: %s may send %q 10 items a second, 120 a minute\n"+
			"and 240 an hour, a batch of n costing n (%s, %s strategy)", tenant, endpoint, where, strategy)
	}, run)
}

// line is the format of a batch's line: at most 96 columns.
const line = "%-7s  %5s  %-31s  %11s  %10s  %10s  %10s\n"

// run sends the tenant's batches, printing each as it is answered and then
// a summary, and returns the calls.
func run(ctx context.Context, env demo.Env) ([]demo.Call, error) {
	var opts []leakybucket.Option
	for _, r := range rules {
		opts = append(opts, leakybucket.PerClient(r.limit))
	}
	limiter, err := demo.Bucket(ctx, env, "apilimit", endpoint, opts...)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(env.Out, line, "time", "items", "answer", "Retry-After", rules[0].name, rules[1].name, rules[2].name)
	calls, err := demo.Play(ctx, env, limiter, endpoint, schedule(), func(made []demo.Call) {
		c := made[len(made)-1]
		answer, retry := "allowed", ""
		if !c.Result.Allowed {
			answer, retry = "denied "+deniedBy(c.Result), c.Result.RetryAfter.String()
		}
		var used [3]string
		for i, rr := range c.Result.Rules {
			used[i] = fmt.Sprintf("%d/%d", rr.Used, rr.Rule.Limit.Requests)
		}
		fmt.Fprintf(env.Out, line, clock(c.At), strconv.Itoa(c.Weight), answer, retry, used[0], used[1], used[2])
	})
	if err != nil {
		return nil, err
	}
	return calls, summarize(env.Out, calls)
}

// schedule returns the tenant's batches: a burst, then a trickle. The
// sizes are pseudo-random, the same on every run.
func schedule() []demo.Call {
	rng := rand.New(rand.NewPCG(7, 42))
	var calls []demo.Call
	for at := time.Duration(0); at < burst; at += burstEvery {
		calls = append(calls, demo.Call{At: at, Client: tenant, Weight: 3 + rng.IntN(5)})
	}
	for at := trickle; at < duration; at += trickleEvery {
		calls = append(calls, demo.Call{At: at, Client: tenant, Weight: 1 + rng.IntN(5)})
	}
	return calls
}

// deniedBy names the rules that denied a call, as "per second + per minute".
func deniedBy(res leakybucket.Result) string {
	var by []string
	for _, d := range res.DeniedBy {
		for _, r := range rules {
			if r.limit == d.Limit {
				by = append(by, r.name)
			}
		}
	}
	return strings.Join(by, " + ")
}

// clock shows a time since the first batch as m:ss.cc.
func clock(d time.Duration) string {
	return fmt.Sprintf("%d:%05.2f", int(d.Minutes()), (d % time.Minute).Seconds())
}

// tally says how many of calls were admitted and denied, and their weights.
func tally(calls []demo.Call) string {
	var n, weight, deniedN, deniedWeight int
	for _, c := range calls {
		if c.Result.Allowed {
			n, weight = n+1, weight+c.Weight
		} else {
			deniedN, deniedWeight = deniedN+1, deniedWeight+c.Weight
		}
	}
	return fmt.Sprintf("%d allowed (%d items), %d denied (%d items)", n, weight, deniedN, deniedWeight)
}

// summarize prints, per rule, the most weight admitted in any of its
// windows, and how many batches it denied, alone or with others.
func summarize(out io.Writer, calls []demo.Call) error {
	fmt.Fprintf(out, "\nin all: %s\n\n", tally(calls))
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "rule\tlimit\tmost items allowed in a window\tbatches denied: alone\twith others\t")
	for _, r := range rules {
		alone, shared := 0, 0
		for _, c := range calls {
			for _, d := range c.Result.DeniedBy {
				switch {
				case d.Limit != r.limit:
				case len(c.Result.DeniedBy) == 1:
					alone++
				default:
					shared++
				}
			}
		}
		fmt.Fprintf(w, "%s\t%v\t%d\t%d\t%d\t\n", r.name, r.limit,
			demo.MostInWindow(calls, tenant, r.limit.Window), alone, shared)
	}
	return w.Flush()
}
