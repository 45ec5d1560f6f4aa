// Command notify is a notification sender that must not flood its users:
// 20 event types, each at most 10 notifications per 30 minutes, and all
// types together at most 100 per 30 minutes. It sends a burst of events
// through one leakybucket.Bucket, printing each as it is sent or dropped
// (and by which caps: a call both caps refuse is reported under both), and
// then a table per type and in total.
//
// It runs on an embedded miniredis by default, and on a real server when
// REDIS_URL is set (redis://host:port/db); it forgets the previous run's
// counts first, so every run starts from an empty window.
//
//	go run ./examples/notify [-strategy logs|sortedset|windows]
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/notify
package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
)

const (
	eventTypes = 20
	events     = 300
	perType    = 10
	allTypes   = 100
	window     = 30 * time.Minute
	recipient  = "notify:user-42" // the resource: one user's notifications
)

// program is what -h says.
var program = demo.Program{
	Name: "notify",
	About: `A notification sender that must not flood its user: 20 event types, each at
most 10 notifications per 30 minutes, and all types together at most 100. It
sends a burst of 300 events, printing each as it is sent or dropped, and by
which cap (a call both caps refuse is dropped by both), then a table of what
was sent and dropped per type and in total.`,
	Real: "the burst is sent at once: nothing sleeps",
}

func main() {
	demo.Main(program, func(where, strategy string) string {
		return fmt.Sprintf("notify: %d event types, each at most %d per %v, all together at most %d\n(%s, %s strategy)",
			eventTypes, perType, window, allTypes, where, strategy)
	}, run)
}

// run sends a fixed pseudo-random burst of events, printing each as it is
// answered and then a table of the outcome, and returns the calls.
func run(ctx context.Context, env demo.Env) ([]demo.Call, error) {
	limiter, err := demo.Bucket(ctx, env, "notify", recipient,
		leakybucket.PerResource(leakybucket.Per(allTypes, window)),
		leakybucket.PerClient(leakybucket.Per(perType, window)),
	)
	if err != nil {
		return nil, err
	}
	const line = "%5s  %-10s  %-30s  %10s  %9s\n"
	fmt.Fprintf(env.Out, line, "event", "type", "answer", "this type", "all types")
	calls, err := demo.Play(ctx, env, limiter, recipient, schedule(), func(made []demo.Call) {
		c := made[len(made)-1]
		all, own := c.Result.Rules[0], c.Result.Rules[1]
		fmt.Fprintf(env.Out, line, fmt.Sprint(len(made)), c.Client, answer(c.Result),
			fmt.Sprintf("%d/%d", own.Used, perType), fmt.Sprintf("%d/%d", all.Used, allTypes))
	})
	if err != nil {
		return nil, err
	}
	return calls, summarize(env.Out, tallies(calls))
}

// schedule returns the burst: a fixed sequence of event types, skewed as
// real traffic is (a few chatty types send most of the events), all at
// once.
func schedule() []demo.Call {
	rng := rand.New(rand.NewPCG(42, 7))
	calls := make([]demo.Call, events)
	for i := range calls {
		calls[i] = demo.Call{Client: typeName(int(eventTypes * math.Pow(rng.Float64(), 2))), Weight: 1}
	}
	return calls
}

// answer says whether an event was sent, or which caps dropped it: every
// rule in DeniedBy, not only the first.
func answer(res leakybucket.Result) string {
	if res.Allowed {
		return "sent"
	}
	byType, byTotal := dropped(res)
	switch {
	case byType && byTotal:
		return "dropped by both caps"
	case byType:
		return "dropped by the type cap"
	}
	return "dropped by the total cap"
}

// dropped reports which caps denied a call.
func dropped(res leakybucket.Result) (byType, byTotal bool) {
	for _, r := range res.DeniedBy {
		byType = byType || r.PerClient
		byTotal = byTotal || !r.PerClient
	}
	return byType, byTotal
}

// tally is what happened to one event type. A call both caps dropped counts
// in byType and in byTotal.
type tally struct {
	events, sent, dropped, byType, byTotal int
}

func (t *tally) add(res leakybucket.Result) {
	t.events++
	if res.Allowed {
		t.sent++
		return
	}
	t.dropped++
	byType, byTotal := dropped(res)
	if byType {
		t.byType++
	}
	if byTotal {
		t.byTotal++
	}
}

// tallies returns the tally of each event type, and of all, last.
func tallies(calls []demo.Call) []tally {
	ts := make([]tally, eventTypes+1)
	index := map[string]int{}
	for i := range eventTypes {
		index[typeName(i)] = i
	}
	for _, c := range calls {
		ts[index[c.Client]].add(c.Result)
		ts[eventTypes].add(c.Result)
	}
	return ts
}

// summarize prints the tallies as a table.
func summarize(out io.Writer, ts []tally) error {
	fmt.Fprintln(out, "\nA call both caps refused counts under both, so the caps' columns may add up to")
	fmt.Fprintln(out, "more than dropped.")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "event type\tevents\tsent\tdropped\tby the type cap\tby the total cap\t")
	for i, t := range ts {
		name := "total"
		if i < eventTypes {
			name = typeName(i)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t\n", name, t.events, t.sent, t.dropped, t.byType, t.byTotal)
	}
	return w.Flush()
}

func typeName(i int) string { return fmt.Sprintf("type-%02d", i+1) }
