package demo

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// Env is what a program runs with.
type Env struct {
	Redis    *redis.Client
	Sleep    func(time.Duration) // see Connect
	Strategy string              // a name that Strategy knows
	Out      io.Writer           // where the program prints
}

// A Run is a program: it makes its calls, printing what happens on
// env.Out, and returns them.
type Run func(ctx context.Context, env Env) ([]Call, error)

// A Program is what -h says of a program.
type Program struct {
	Name  string // as run: "notify" for go run ./examples/notify
	About string // what it does and prints, wrapped to fit 80 columns
	Real  string // how it runs on a real server, after "There ": "the program sleeps for real: it takes 25 s"
}

// Main runs a program from the command line: it reads the -strategy flag
// (-h prints p's usage), connects (see Connect), prints heading(where,
// strategy) and a blank line, and runs run, printing to standard output.
// It exits on an error.
func Main(p Program, heading func(where, strategy string) string, run Run) {
	strategy := Flags(flag.CommandLine, p)
	flag.Parse()
	if _, err := Strategy(*strategy); err != nil {
		log.Fatal(err)
	}
	rdb, where, sleep, err := Connect()
	if err != nil {
		log.Fatal(err)
	}
	defer rdb.Close()
	fmt.Printf("%s\n\n", heading(where, *strategy))
	if _, err := run(context.Background(), Env{rdb, sleep, *strategy, os.Stdout}); err != nil {
		log.Fatal(err)
	}
}

// Flags defines the flags of p on fs, the -strategy flag, and makes -h
// print p's usage (see Usage).
func Flags(fs *flag.FlagSet, p Program) (strategy *string) {
	strategy = fs.String("strategy", "logs", StrategyUsage)
	fs.Usage = Usage(fs, p)
	return strategy
}

// Usage returns a usage function for p: what it does, every flag of fs,
// and REDIS_URL, written to fs.Output().
func Usage(fs *flag.FlagSet, p Program) func() {
	return func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: go run ./examples/%s [flags]\n\n%s\n\nflags:\n", p.Name, p.About)
		fs.PrintDefaults()
		fmt.Fprintf(out, `
environment:
  REDIS_URL  a Redis to run on, as redis://[user:password@]host:port/db.
             There %s.
             Unset: an embedded miniredis whose clock jumps when the program
             sleeps, so the run is instant. Each run first forgets the
             previous run's counts.
`, p.Real)
	}
}

// Bucket returns a Bucket of env's strategy, the rules and options in
// opts, and a key prefix of the program's name and the strategy's: Buckets
// of different strategies must not share one. It first forgets every count
// of resource, so that each run starts from empty windows.
func Bucket(ctx context.Context, env Env, program, resource string, opts ...leakybucket.Option) (*leakybucket.Bucket, error) {
	strategy, err := Strategy(env.Strategy)
	if err != nil {
		return nil, err
	}
	opts = append([]leakybucket.Option{
		leakybucket.WithStrategy(strategy),
		leakybucket.WithPrefix(program + "-example-" + env.Strategy),
	}, opts...)
	limiter, err := leakybucket.New(env.Redis, opts...)
	if err != nil {
		return nil, err
	}
	return limiter, limiter.FlushAll(ctx, resource)
}

// Play makes the calls of schedule, in the order of At, to AllowN of
// resource, sleeping until each is due, and calls show after each with the
// calls made so far. It returns them, with their Results.
func Play(ctx context.Context, env Env, limiter *leakybucket.Bucket, resource string, schedule []Call, show func(made []Call)) ([]Call, error) {
	var made []Call
	var now time.Duration
	for _, c := range schedule {
		env.Sleep(c.At - now)
		now = c.At
		var err error
		if c.Result, err = limiter.AllowN(ctx, resource, c.Client, c.Weight); err != nil {
			return made, err
		}
		made = append(made, c)
		show(made)
	}
	return made, nil
}
