// Command notify is a notification sender that must not flood its users:
// 20 event types, each at most 10 notifications per 30 minutes, and all
// types together at most 100 per 30 minutes. It sends a burst of events
// through one leakybucket.Bucket and prints what was sent and dropped per
// type and in total.
//
// It runs on an embedded miniredis by default, and on a real server when
// REDIS_URL is set (redis://host:port/db); it forgets the previous run's
// logs first, so every run starts from an empty window.
//
//	go run ./examples/notify
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/notify
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
	"github.com/redis/go-redis/v9"
)

const (
	eventTypes = 20
	events     = 300
	perType    = 10
	allTypes   = 100
	window     = 30 * time.Minute
	recipient  = "notify:user-42" // the resource: one user's notifications
)

func main() {
	rdb, where, _, err := demo.Connect() // a burst: no waiting
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	fmt.Printf("notify: %d event types, each at most %d per %v, all together at most %d per %v (%s)\n\n",
		eventTypes, perType, window, allTypes, window, where)
	if _, err := run(context.Background(), rdb, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// tally is what happened to one event type.
type tally struct {
	events, sent, droppedByType, droppedByTotal int
}

// run sends a fixed pseudo-random burst of events and prints a table of
// the outcome; it returns the tallies, the total last.
func run(ctx context.Context, rdb *redis.Client, out io.Writer) ([]tally, error) {
	limiter, err := leakybucket.New(rdb,
		leakybucket.WithPrefix("notify-example"),
		leakybucket.PerResource(leakybucket.Per(allTypes, window)),
		leakybucket.PerClient(leakybucket.Per(perType, window)),
	)
	if err != nil {
		return nil, err
	}
	if err := limiter.FlushAll(ctx, recipient); err != nil {
		return nil, err
	}
	tallies := make([]tally, eventTypes+1)
	total := &tallies[eventTypes]
	// A fixed burst, skewed as real traffic is: a few chatty types send
	// most of the events.
	rng := rand.New(rand.NewPCG(42, 7))
	for range events {
		i := int(eventTypes * math.Pow(rng.Float64(), 2))
		res, err := limiter.Allow(ctx, recipient, typeName(i))
		if err != nil {
			return nil, err
		}
		t := &tallies[i]
		t.events++
		total.events++
		switch {
		case res.Allowed:
			t.sent++
			total.sent++
		case res.DeniedBy[0].Scope == leakybucket.ScopeResource:
			t.droppedByTotal++
			total.droppedByTotal++
		default:
			t.droppedByType++
			total.droppedByType++
		}
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "event type\tevents\tsent\tdropped (type cap)\tdropped (total cap)\t")
	for i, t := range tallies {
		name := "total"
		if i < eventTypes {
			name = typeName(i)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t\n", name, t.events, t.sent, t.droppedByType, t.droppedByTotal)
	}
	return tallies, w.Flush()
}

func typeName(i int) string { return fmt.Sprintf("type-%02d", i+1) }
