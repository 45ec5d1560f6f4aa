package leakybucket_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket"
)

func ExampleNew() {
	// An in-memory Redis for this example: pass New your own client.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	// Each API key may call an endpoint 3 times a minute, and the endpoint
	// takes 100 calls a minute from all keys together.
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerClient(leakybucket.PerMinute(3)),
		leakybucket.PerResource(leakybucket.PerMinute(100)),
	)
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	for range 4 {
		res, err := limiter.Allow(ctx, "GET /search", "api-key-42")
		if err != nil {
			log.Fatal(err) // Redis unreachable, or the context ended
		}
		if !res.Allowed {
			fmt.Printf("denied: Retry-After: %.0f\n", math.Ceil(res.RetryAfter.Seconds()))
			continue
		}
		fmt.Printf("allowed: %d left\n", res.Remaining)
	}
	// Output:
	// allowed: 2 left
	// allowed: 1 left
	// allowed: 0 left
	// denied: Retry-After: 60
}

// A service of one instance, or a test without Redis, keeps its counts in
// process with NewLocal: the same Bucket, rules and Results, so moving to
// Redis later is a change to this line only.
func ExampleNewLocal() {
	limiter, err := leakybucket.NewLocal(
		leakybucket.PerClient(leakybucket.PerMinute(2)),
		leakybucket.WithStrategy(leakybucket.SortedSet),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for range 3 {
		res, err := limiter.Allow(ctx, "POST /login", "203.0.113.7")
		if err != nil {
			log.Fatal(err) // only a context that ended
		}
		fmt.Printf("allowed %v, %d left\n", res.Allowed, res.Remaining)
	}
	// Output:
	// allowed true, 1 left
	// allowed true, 0 left
	// allowed false, 0 left
}

// newExampleClient returns a client of an in-memory Redis whose clock is
// frozen, so that the examples' durations print the same on every run.
func newExampleClient() *redis.Client {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	mr.SetTime(time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC))
	return redis.NewClient(&redis.Options{Addr: mr.Addr()})
}

// A notification sender: all event types together at most 5 per 30
// minutes, each type at most 2. A request denied by either rule is recorded
// by neither.
func Example_hierarchy() {
	rdb := newExampleClient()
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerResource(leakybucket.Per(5, 30*time.Minute)),
		leakybucket.PerClient(leakybucket.Per(2, 30*time.Minute)),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, event := range []string{"login", "login", "login", "invoice", "invoice", "alert", "alert"} {
		res, err := limiter.Allow(ctx, "notify:user-7", event)
		if err != nil {
			log.Fatal(err)
		}
		switch {
		case res.Allowed:
			fmt.Printf("%-7s sent\n", event)
		case res.DeniedBy[0].PerClient:
			fmt.Printf("%-7s dropped by the per-client rule\n", event)
		default:
			fmt.Printf("%-7s dropped by the per-resource rule\n", event)
		}
	}
	// Output:
	// login   sent
	// login   sent
	// login   dropped by the per-client rule
	// invoice sent
	// invoice sent
	// alert   sent
	// alert   dropped by the per-resource rule
}

// Several windows on one client, with weights: a batch of n items costs n.
func Example_severalWindows() {
	limiter, err := leakybucket.New(newExampleClient(),
		leakybucket.PerClient(leakybucket.PerSecond(10)),
		leakybucket.PerClient(leakybucket.PerMinute(120)),
		leakybucket.PerClient(leakybucket.PerHour(240)),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, batch := range []int{6, 4, 1} {
		res, err := limiter.AllowN(ctx, "upload", "tenant-3", batch)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("batch of %d: allowed=%v remaining=%d retry-after=%v denied-by=%v\n",
			batch, res.Allowed, res.Remaining, res.RetryAfter, res.DeniedBy)
	}
	// Output:
	// batch of 6: allowed=true remaining=4 retry-after=0s denied-by=[]
	// batch of 4: allowed=true remaining=0 retry-after=0s denied-by=[]
	// batch of 1: allowed=false remaining=0 retry-after=1s denied-by=[per-client 10 per 1s]
}

// A minimum spacing between requests is a limit of one per interval, under
// every strategy. Windows(time.Second) counts a call as made at the end of
// its second, so it may ask to wait up to a second longer. (RetryAfter is
// to the millisecond: rounded here, as the two calls may fall in two
// milliseconds.)
func Example_minimumSpacing() {
	for _, strategy := range []leakybucket.Strategy{leakybucket.Logs, leakybucket.SortedSet, leakybucket.Windows(time.Second)} {
		limiter, err := leakybucket.New(newExampleClient(),
			leakybucket.WithStrategy(strategy),
			leakybucket.PerClient(leakybucket.Per(1, 2*time.Second)))
		if err != nil {
			log.Fatal(err)
		}
		ctx := context.Background()
		first, err := limiter.Allow(ctx, "password-reset", "alice@example.com")
		if err != nil {
			log.Fatal(err)
		}
		second, err := limiter.Allow(ctx, "password-reset", "alice@example.com")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-11v first allowed=%v, second allowed=%v retry-after=%v\n",
			strategy, first.Allowed, second.Allowed, second.RetryAfter.Round(100*time.Millisecond))
	}
	// Output:
	// logs        first allowed=true, second allowed=false retry-after=2s
	// sorted set  first allowed=true, second allowed=false retry-after=2s
	// windows(1s) first allowed=true, second allowed=false retry-after=3s
}

// Against brute force: with WithRecordDenied, every attempt counts, so a
// client who keeps guessing stays locked out until it stops for a window.
func ExampleWithRecordDenied() {
	limiter, err := leakybucket.New(newExampleClient(),
		leakybucket.WithRecordDenied(),
		leakybucket.PerClient(leakybucket.Per(3, 15*time.Minute)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for attempt := 1; attempt <= 5; attempt++ {
		res, err := limiter.Allow(ctx, "login", "203.0.113.9")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("attempt %d: allowed=%v counted=%d\n", attempt, res.Allowed, res.Rules[0].Used)
	}
	// Output:
	// attempt 1: allowed=true counted=1
	// attempt 2: allowed=true counted=2
	// attempt 3: allowed=true counted=3
	// attempt 4: allowed=false counted=4
	// attempt 5: allowed=false counted=5
}

// WithReplicas admits a call only once a replica has acknowledged its
// count, so that a failover to that replica keeps it. The in-memory Redis
// of this example has no replica: the call fails as unavailable, nothing
// stays counted, and this caller fails closed. In production, give New a
// client that follows a failover: redis.NewFailoverClient (Sentinel), or
// a *redis.ClusterClient.
func ExampleWithReplicas() {
	limiter, err := leakybucket.New(newExampleClient(),
		leakybucket.WithStrategy(leakybucket.SortedSet),
		leakybucket.WithReplicas(1, 50*time.Millisecond),
		leakybucket.PerClient(leakybucket.PerMinute(3)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	res, err := limiter.Allow(ctx, "POST /invoices", "tenant-7")
	switch {
	case errors.Is(err, leakybucket.ErrNotReplicated):
		fmt.Println("not replicated: refused (fail closed)")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("allowed:", res.Allowed)
	}
	fmt.Println("unavailable too:", errors.Is(err, leakybucket.ErrUnavailable))
	peek, err := limiter.Peek(ctx, "POST /invoices", "tenant-7")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("left after one more call:", peek.Remaining)
	// Output:
	// not replicated: refused (fail closed)
	// unavailable too: true
	// left after one more call: 2
}

// Peek answers like Allow without recording; Flush forgets a client.
func ExampleBucket_Flush() {
	limiter, err := leakybucket.New(newExampleClient(), leakybucket.PerClient(leakybucket.PerHour(1)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if _, err := limiter.Allow(ctx, "login", "bob"); err != nil {
		log.Fatal(err)
	}
	before, _ := limiter.Peek(ctx, "login", "bob")
	if err := limiter.Flush(ctx, "login", "bob"); err != nil {
		log.Fatal(err)
	}
	after, _ := limiter.Peek(ctx, "login", "bob")
	fmt.Println("before Flush:", before.Allowed, "after:", after.Allowed)
	// Output: before Flush: false after: true
}

// Wait blocks until the call is admitted, as x/time/rate's Wait does, but
// refuses at once a wait that would outlast the context's deadline.
func ExampleBucket_Wait() {
	limiter, err := leakybucket.New(newExampleClient(), leakybucket.PerClient(leakybucket.PerMinute(1)))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for job := 1; job <= 2; job++ {
		// Admitted at once while there is room; else sleeps until there is.
		err := limiter.Wait(ctx, "export", "tenant-3")
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			// At once: "leakybucket: Wait(n=1) would exceed context
			// deadline: retry after 1m0s, deadline in 5s".
			fmt.Printf("job %d: refused, it would wait past the deadline\n", job)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("job %d: admitted\n", job)
		}
	}
	// Output:
	// job 1: admitted
	// job 2: refused, it would wait past the deadline
}

// A weight above a rule's Requests can never be admitted: AllowN denies it,
// as x/time/rate's AllowN answers false for n above the burst, with
// RetryAfter Never, recording nothing; WaitN refuses it at once.
func ExampleBucket_AllowN_never() {
	limiter, err := leakybucket.New(newExampleClient(), leakybucket.PerClient(leakybucket.Per(10, time.Second)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	res, err := limiter.AllowN(ctx, "export", "tenant-3", 1000)
	if err != nil {
		log.Fatal(err) // not for the weight: Redis unreachable, or the context ended
	}
	if !res.Allowed && res.RetryAfter == leakybucket.Never {
		fmt.Printf("never: %v is too small for 1000; %d left\n", res.DeniedBy, res.Remaining)
	}
	res, _ = limiter.AllowN(ctx, "export", "tenant-3", 4) // the denial took no room
	fmt.Printf("allowed: %t, %d left\n", res.Allowed, res.Remaining)

	err = limiter.WaitN(ctx, "export", "tenant-3", 1000)
	fmt.Println("WaitN:", errors.Is(err, leakybucket.ErrInvalidWeight))
	// Output:
	// never: [per-client 10 per 1s] is too small for 1000; 10 left
	// allowed: true, 6 left
	// WaitN: true
}

// An observer hears every decision once it is made: here a log line per
// denial or error, and a count of what was admitted. Keep it fast: it runs
// in the caller's goroutine. The module
// github.com/leakybucket/leakybucket/otelmetrics makes one that records
// OpenTelemetry metrics.
func ExampleWithObserver() {
	admitted := 0
	observe := func(_ context.Context, d leakybucket.Decision) {
		switch {
		case d.Err != nil:
			fmt.Printf("%s %s/%s: error: %v\n", d.Op, d.Resource, d.Client, d.Err)
		case d.Op == "allow" && d.Allowed:
			admitted++
		case d.Op == "allow":
			fmt.Printf("%s %s/%s: denied by %v\n", d.Op, d.Resource, d.Client, d.DeniedBy)
		}
	}
	limiter, err := leakybucket.New(newExampleClient(),
		leakybucket.PerResource(leakybucket.PerMinute(3)),
		leakybucket.PerClient(leakybucket.PerMinute(2)),
		leakybucket.WithObserver(observe),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, client := range []string{"ann", "ann", "ann", "bob", "ann", ""} {
		_, _ = limiter.Allow(ctx, "GET /search", client) // the observer reports
	}
	fmt.Println("admitted:", admitted)
	// Output:
	// allow GET /search/ann: denied by [per-client 2 per 1m0s]
	// allow GET /search/ann: denied by [per-resource 3 per 1m0s per-client 2 per 1m0s]
	// allow GET /search/: error: leakybucket: empty client with a per-client rule
	// admitted: 3
}

// Two instances of a service share a rule of 10 calls a minute per API
// key. WithFallback(2) keeps them limited while Redis is down: each
// decides in process by its share, 5 a minute, the Result saying so, and
// goes back to Redis once it answers again.
func ExampleWithFallback() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	limiter, err := leakybucket.New(rdb,
		leakybucket.PerClient(leakybucket.PerMinute(10)),
		leakybucket.WithFallback(2), // the instances that share the rule
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	show := func(res leakybucket.Result, err error) {
		where := "on Redis"
		if res.Fallback {
			where = "in process"
		}
		switch {
		case err != nil:
			fmt.Println("error:", err)
		case res.Allowed:
			fmt.Printf("%s: allowed, %d of %d left\n", where, res.Remaining, res.Rules[0].Rule.Limit.Requests)
		default:
			fmt.Printf("%s: denied, retry after %v\n", where, res.RetryAfter.Round(time.Second))
		}
	}
	show(limiter.Allow(ctx, "GET /search", "api-key-42"))

	mr.Close() // Redis goes down
	for range 6 {
		show(limiter.Allow(ctx, "GET /search", "api-key-42"))
	}

	if err := mr.Restart(); err != nil { // and comes back
		log.Fatal(err)
	}
	res, err := limiter.Allow(ctx, "GET /search", "api-key-7")
	for err == nil && res.Fallback { // until the breaker's probe finds it back
		time.Sleep(10 * time.Millisecond)
		res, err = limiter.Allow(ctx, "GET /search", "api-key-7")
	}
	show(limiter.Allow(ctx, "GET /search", "api-key-42")) // Redis kept its count
	// Output:
	// on Redis: allowed, 9 of 10 left
	// in process: allowed, 4 of 5 left
	// in process: allowed, 3 of 5 left
	// in process: allowed, 2 of 5 left
	// in process: allowed, 1 of 5 left
	// in process: allowed, 0 of 5 left
	// in process: denied, retry after 1m0s
	// on Redis: allowed, 8 of 10 left
}

// Seed 002's notification sender: all event types of a user together at
// most 3 per fixed half hour (FixedWindows: a rule without a precision is a
// fixed window, which resets at :00 and :30 UTC), each type at most 2 per
// sliding half hour counted by the minute. The example's Redis stands at
// 12:00:00: the fixed window ends at 12:30, and the invoices, counted at
// the end of their minute, leave at 12:30:59.999.
func ExampleLimit_WithPrecision() {
	limiter, err := leakybucket.New(newExampleClient(),
		leakybucket.WithStrategy(leakybucket.FixedWindows),
		leakybucket.PerResource(leakybucket.Per(3, 30*time.Minute)),
		leakybucket.PerClient(leakybucket.Per(2, 30*time.Minute).WithPrecision(time.Minute)),
	)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, event := range []string{"invoice", "invoice", "invoice", "alert", "digest"} {
		res, err := limiter.Allow(ctx, "user-7", event)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%-7s allowed=%-5v retry-after=%-9v denied-by=%v\n", event, res.Allowed, res.RetryAfter, res.DeniedBy)
	}
	// Output:
	// invoice allowed=true  retry-after=0s        denied-by=[]
	// invoice allowed=true  retry-after=0s        denied-by=[]
	// invoice allowed=false retry-after=30m59.999s denied-by=[per-client 2 per 30m0s (precision 1m0s)]
	// alert   allowed=true  retry-after=0s        denied-by=[]
	// digest  allowed=false retry-after=30m0s     denied-by=[per-resource 3 per 30m0s]
}

// A worker that decides in process keeps one Result and lets AllowNInto
// write each decision in it: no allocation per call.
func ExampleBucket_AllowNInto() {
	limiter, err := leakybucket.NewLocal(leakybucket.PerClient(leakybucket.PerSecond(3)))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	var res leakybucket.Result
	sent := 0
	for range 5 {
		if err := limiter.AllowNInto(ctx, "smtp", "tenant-1", 1, &res); err != nil {
			log.Fatal(err)
		}
		if res.Allowed {
			sent++
		}
	}
	fmt.Printf("sent %d of 5, then denied by %v\n", sent, res.DeniedBy)
	// Output:
	// sent 3 of 5, then denied by [per-client 3 per 1s]
}
