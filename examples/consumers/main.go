// Command consumers is an API shared by several consumers: it takes at most
// 5 requests per 10 seconds from all of them together, and each consumer
// at most 3 per 10 seconds, both as sliding windows. Four consumers call it
// at their own pace for 25 seconds; consumers prints each request's fate
// (which rule denied it, and its Retry-After) and a summary per consumer.
//
// It runs on an embedded miniredis by default, whose clock is simulated so
// the 25 seconds pass at once, and on a real server when REDIS_URL is set
// (redis://host:port/db), where it takes the 25 seconds. It forgets the
// previous run's counts first, so every run starts from empty windows.
//
//	go run ./examples/consumers [-strategy logs|sortedset|windows]
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/consumers
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

const (
	api         = "GET /v1/quotes" // the resource
	total       = 5                // requests per window, all consumers together
	perConsumer = 3                // requests per window, each consumer
	window      = 10 * time.Second
	duration    = 25 * time.Second
)

// A consumer calls the API every so often from its first call on.
type consumer struct {
	name         string
	first, every time.Duration
}

// Their paces keep every call at least 200ms away from the edge of
// another's window, so on a real server, where calls land a few ms late,
// the answers are those of the simulated clock.
var consumers = []consumer{
	{"mobile-app", 0, 1400 * time.Millisecond}, // chatty: its own limit stops it
	{"web", time.Second, 5500 * time.Millisecond},
	{"batch-job", 3500 * time.Millisecond, 7 * time.Second},
	{"partner", 3 * time.Second, 9 * time.Second},
}

// program is what -h says.
var program = demo.Program{
	Name: "consumers",
	About: `An API that takes at most 5 requests per 10 s from all its consumers together,
and 3 per 10 s from each. Four consumers call it at their own pace for 25 s.
It prints each request as it is answered (allowed, or which limit denied it,
and its Retry-After), then a summary per consumer.`,
	Real: "the program sleeps for real: it takes 25 s",
}

func main() {
	demo.Main(program, func(where, strategy string) string {
		return fmt.Sprintf("consumers: %q takes %d requests per %v in all, %d from each consumer\n(%s, %s strategy)",
			api, total, window, perConsumer, where, strategy)
	}, run)
}

// run makes every consumer's calls in time order, printing each as it is
// answered and then a summary, and returns the calls.
func run(ctx context.Context, env demo.Env) ([]demo.Call, error) {
	limiter, err := demo.Bucket(ctx, env, "consumers", api,
		leakybucket.PerResource(leakybucket.Per(total, window)),
		leakybucket.PerClient(leakybucket.Per(perConsumer, window)),
	)
	if err != nil {
		return nil, err
	}
	const line = "%6s  %-10s  %-25s  %-11s  %9s  %7s\n"
	fmt.Fprintf(env.Out, line, "time", "consumer", "answer", "Retry-After", "used: all", "its own")
	calls, err := demo.Play(ctx, env, limiter, api, schedule(), func(made []demo.Call) {
		c := made[len(made)-1]
		retry := ""
		if !c.Result.Allowed {
			retry = c.Result.RetryAfter.String()
		}
		all, own := c.Result.Rules[0], c.Result.Rules[1]
		fmt.Fprintf(env.Out, line, fmt.Sprintf("%.1fs", c.At.Seconds()), c.Client, answer(c.Result), retry,
			fmt.Sprintf("%d/%d", all.Used, total), fmt.Sprintf("%d/%d", own.Used, perConsumer))
	})
	if err != nil {
		return nil, err
	}
	return calls, summarize(env.Out, calls)
}

// schedule returns every consumer's calls, in time order.
func schedule() []demo.Call {
	var calls []demo.Call
	for _, c := range consumers {
		for at := c.first; at < duration; at += c.every {
			calls = append(calls, demo.Call{At: at, Client: c.name, Weight: 1})
		}
	}
	slices.SortStableFunc(calls, func(a, b demo.Call) int { return cmp.Compare(a.At, b.At) })
	return calls
}

// answer says whether a call was allowed, or which rules denied it.
func answer(res leakybucket.Result) string {
	if res.Allowed {
		return "allowed"
	}
	switch {
	case len(res.DeniedBy) == 2:
		return "denied by both limits"
	case !res.DeniedBy[0].PerClient:
		return "denied by the API's limit"
	}
	return "denied by its own limit"
}

// summarize prints, per consumer and in all, what was allowed and denied
// (by its own limit alone, the API's alone, or both), and the most allowed
// in any window.
func summarize(out io.Writer, calls []demo.Call) error {
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "consumer\trequests\tallowed\tdenied: own\tAPI's\tboth\tmost allowed in %v\t\n", window)
	row := func(name, client string, limit int) {
		var requests, allowed int
		denied := map[string]int{}
		for _, c := range calls {
			if client != "" && c.Client != client {
				continue
			}
			requests++
			if c.Result.Allowed {
				allowed++
			} else {
				denied[answer(c.Result)]++
			}
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d of %d\t\n", name, requests, allowed,
			denied["denied by its own limit"], denied["denied by the API's limit"],
			denied["denied by both limits"],
			demo.MostInWindow(calls, client, window), limit)
	}
	for _, c := range consumers {
		row(c.name, c.name, perConsumer)
	}
	row("all", "", total)
	return w.Flush()
}
