// Command httpserver serves GET / behind the httplimit middleware: each
// API key (the X-API-Key header), or else each client IP address, may call
// it 5 times per 10 seconds, a sliding window. Every response carries the
// RateLimit-Policy and RateLimit header fields; a denied request gets 429
// Too Many Requests and Retry-After.
//
// It runs on an embedded miniredis (on the real clock) unless REDIS_URL is
// set (redis://host:port/db), and prints where it listens and a curl line
// to try. Stop it with Ctrl-C.
//
//	go run ./examples/httpserver [-addr 127.0.0.1:8080] [-strategy logs|sortedset|windows]
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/httpserver
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/examples/internal/demo"
	"github.com/leakybucket/leakybucket/httplimit"
	"github.com/redis/go-redis/v9"
)

const (
	resource = "GET /"
	requests = 5                // per window, per API key or client IP
	window   = 10 * time.Second // sliding
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Fatal(err)
	}
}

// options are the command line's.
type options struct {
	addr, strategy, trusted string
	failOpen, legacy        bool
}

// parse reads the flags of args; -h prints their usage on stderr.
func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("httpserver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "`host:port` to listen on (port 0: any free port)")
	fs.StringVar(&o.strategy, "strategy", "logs", demo.StrategyUsage)
	fs.StringVar(&o.trusted, "trusted-proxies", "", "comma-separated `prefixes` (10.0.0.0/8,::1/128) of proxies whose X-Forwarded-For is believed; by default the client is the peer's address")
	fs.BoolVar(&o.failOpen, "fail-open", false, "serve requests when Redis cannot decide, logging the error (default: answer 503)")
	fs.BoolVar(&o.legacy, "legacy-headers", false, "also send RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (draft -06)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: httpserver [flags]\n\n"+
			"Serves GET / on -addr, limiting each X-API-Key, else each client IP, to %d requests per %v.\n\n"+
			"Environment:\n  REDIS_URL\n    \tthe Redis to count on (redis://host:port/db); unset: an embedded miniredis\n\nFlags:\n", requests, window)
		fs.PrintDefaults()
	}
	return o, fs.Parse(args)
}

// run serves until ctx ends. It sends the server's URL on ready, if not
// nil, once it listens.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	rdb, where, closeRedis, err := connect()
	if err != nil {
		return err
	}
	defer closeRedis()
	h, err := newHandler(rdb, o, stderr)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	url := "http://" + l.Addr().String()
	fmt.Fprintf(stdout, "httpserver: listening on %s (%s, %s strategy): %d requests per %v per API key or client IP\n", url, where, o.strategy, requests, window)
	fmt.Fprintf(stdout, "try: for i in 1 2 3 4 5 6; do curl -si -H 'X-API-Key: demo' %s/ | grep -iE '^(HTTP|RateLimit|Retry-After)'; done\n", url)
	if ready != nil {
		ready <- url
	}
	return serve(ctx, l, h)
}

// connect returns a client of $REDIS_URL, or of an embedded miniredis
// whose clock is the real one, where it runs, and how to close both.
func connect() (rdb *redis.Client, where string, closeAll func(), err error) {
	if url := os.Getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		rdb = redis.NewClient(opts)
		return rdb, "Redis at " + opts.Addr, func() { rdb.Close() }, nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, err
	}
	mr.ClockTTL(true) // keys expire as real time passes
	rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, "embedded miniredis", func() { rdb.Close(); mr.Close() }, nil
}

// newHandler returns the server's routes: GET /, limited.
func newHandler(rdb *redis.Client, o options, stderr io.Writer) (http.Handler, error) {
	strategy, err := demo.Strategy(o.strategy)
	if err != nil {
		return nil, err
	}
	limiter, err := leakybucket.New(rdb,
		leakybucket.WithStrategy(strategy),
		leakybucket.WithPrefix("httpserver-example-"+o.strategy),
		leakybucket.PerClient(leakybucket.Per(requests, window)))
	if err != nil {
		return nil, err
	}
	trusted, err := prefixes(o.trusted)
	if err != nil {
		return nil, err
	}
	opts := []httplimit.Option{httplimit.WithKey(httplimit.Header("X-API-Key", httplimit.XForwardedFor(trusted...)))}
	if o.failOpen {
		logger := log.New(stderr, "httpserver: ", log.LstdFlags)
		opts = append(opts, httplimit.WithFailOpen(func(r *http.Request, err error) { logger.Printf("%s %s served unlimited: %v", r.Method, r.URL, err) }))
	}
	if o.legacy {
		opts = append(opts, httplimit.WithLegacyHeaders())
	}
	limit, err := httplimit.New(limiter, resource, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", limit(http.HandlerFunc(hello)))
	return mux, nil
}

// hello answers an admitted request.
func hello(w http.ResponseWriter, r *http.Request) {
	if res, ok := httplimit.ResultFrom(r.Context()); ok {
		fmt.Fprintf(w, "hello: %d of %d requests left in this window\n", res.Remaining, requests)
		return
	}
	fmt.Fprintln(w, "hello (unlimited: the limiter could not decide)")
}

// prefixes parses a comma-separated list of prefixes, or addresses.
func prefixes(list string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("-trusted-proxies: %w", err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p)
	}
	return out, nil
}

// serve serves on l until ctx ends, then shuts the server down.
func serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}
