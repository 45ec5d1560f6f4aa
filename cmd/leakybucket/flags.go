package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/leakybucket/leakybucket"
)

// globals are the flags that every subcommand takes, before or after its
// name: where Redis is, and the Bucket to make there.
type globals struct {
	redisURL string
	cluster  string
	prefix   string
	timeout  time.Duration
	strategy strategyFlag
	rules    []leakybucket.Rule // in the order given, as New takes them
}

// newGlobals returns the defaults.
func newGlobals() *globals {
	return &globals{
		redisURL: "redis://localhost:6379/0",
		prefix:   "leakybucket", // WithPrefix's default
		timeout:  5 * time.Second,
		strategy: strategyFlag{text: "logs", strategy: leakybucket.Logs},
	}
}

// register defines the global flags on fs, with the values g holds as
// defaults, so that flags given before the subcommand's name stay set when
// the subcommand's flag set is made.
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.redisURL, "redis", g.redisURL, "the Redis `URL`: redis://[user:password@]host:port/db, or rediss:// for TLS")
	fs.StringVar(&g.cluster, "cluster", g.cluster, "the nodes of a Redis Cluster, as `host:port,...`, instead of the host of -redis (whose user, password and TLS apply)")
	fs.StringVar(&g.prefix, "prefix", g.prefix, "the `prefix` of the Bucket's keys (WithPrefix)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "how long the call to Redis may take")
	fs.Var(&g.strategy, "strategy", "the Bucket's `strategy`: logs, sortedset, windows:<precision> (as windows:1s), windows:fixed (FixedWindows: a rule without a precision is a fixed window), or gcra (a leaky bucket)")
	fs.Var(ruleFlag{false, &g.rules}, "resource-limit", "a per-resource rule, as `100/30m` (repeatable; 10/s means 10/1s; 100/1h@1m counts it at a precision of 1m under windows; 10/s,burst=50 holds a burst of 50 under gcra)")
	fs.Var(ruleFlag{true, &g.rules}, "client-limit", "a per-client rule, as `10/1m` (repeatable; 10/1h@1m for a precision, 10/s,burst=50 for a burst)")
}

// options returns the options of New for the flags, with rules as the
// Bucket's rules.
func (g *globals) options(rules []leakybucket.Rule) []leakybucket.Option {
	opts := []leakybucket.Option{leakybucket.WithPrefix(g.prefix), leakybucket.WithStrategy(g.strategy.strategy)}
	for _, r := range rules {
		opts = append(opts, ruleOption(r))
	}
	return opts
}

// ruleOption returns the option that adds r.
func ruleOption(r leakybucket.Rule) leakybucket.Option {
	if r.PerClient {
		return leakybucket.PerClient(r.Limit)
	}
	return leakybucket.PerResource(r.Limit)
}

// perClient reports whether a rule counts per client: then every
// subcommand but flush-all needs a client.
func (g *globals) perClient() bool {
	for _, r := range g.rules {
		if r.PerClient {
			return true
		}
	}
	return false
}

// ruleFlag is -resource-limit or -client-limit: each use adds a rule,
// per-client or not, to rules.
type ruleFlag struct {
	perClient bool
	rules     *[]leakybucket.Rule
}

// String lists the flag's rules, as "100/30m 10/1h@1m".
func (f ruleFlag) String() string {
	if f.rules == nil { // the zero value, which flag.PrintDefaults makes
		return ""
	}
	var limits []string
	for _, r := range *f.rules {
		if r.PerClient == f.perClient {
			limits = append(limits, formatLimit(r.Limit))
		}
	}
	return strings.Join(limits, " ")
}

// formatLimit spells l as parseLimit reads it.
func formatLimit(l leakybucket.Limit) string {
	s := fmt.Sprintf("%d/%s", l.Requests, shortDuration(l.Window))
	if l.Precision != 0 {
		s += "@" + shortDuration(l.Precision)
	}
	if l.Burst != 0 {
		s += burstSep + strconv.Itoa(l.Burst)
	}
	return s
}

// Set adds the rule s.
func (f ruleFlag) Set(s string) error {
	l, err := parseLimit(s)
	if err != nil {
		return err
	}
	*f.rules = append(*f.rules, leakybucket.Rule{PerClient: f.perClient, Limit: l})
	return nil
}

// burstSep introduces a rule's burst in a limit: 10/s,burst=50.
const burstSep = ",burst="

// parseLimit parses "<requests>/<window>[@<precision>][,burst=<burst>]":
// 100/30m, 10/1m30s, 5/s (a window of one unit may omit the 1), 100/1h@1m,
// 10/s,burst=50 (under gcra). Requests and the burst must be positive,
// the window at least 1ms and the precision between 1ms and the window,
// as New wants (which also bounds window/precision, and refuses a
// precision under gcra and a burst under the other strategies).
func parseLimit(s string) (leakybucket.Limit, error) {
	rest, burst, bursty := strings.Cut(s, burstSep)
	l, err := parsePrecise(s, rest)
	if err != nil || !bursty {
		return l, err
	}
	b, err := strconv.Atoi(burst)
	if err != nil || b < 1 {
		return leakybucket.Limit{}, fmt.Errorf("limit %q: burst %q is not a positive whole number, as 10/s,burst=50", s, burst)
	}
	return l.WithBurst(b), nil
}

// parsePrecise parses the "<requests>/<window>[@<precision>]" of limit s.
func parsePrecise(s, limit string) (leakybucket.Limit, error) {
	rest, precision, precise := strings.Cut(limit, "@")
	l, err := parseRate(s, rest)
	if err != nil || !precise {
		return l, err
	}
	d, err := time.ParseDuration(precision)
	if err != nil || d < time.Millisecond || d > l.Window {
		return leakybucket.Limit{}, fmt.Errorf("limit %q: precision %q is not a duration from 1ms to the window, as 1m", s, precision)
	}
	return l.WithPrecision(d), nil
}

// parseRate parses the "<requests>/<window>" of limit s.
func parseRate(s, rate string) (leakybucket.Limit, error) {
	count, window, ok := strings.Cut(rate, "/")
	if !ok {
		return leakybucket.Limit{}, fmt.Errorf("limit %q: want <requests>/<window>, as 100/30m", s)
	}
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		return leakybucket.Limit{}, fmt.Errorf("limit %q: requests %q is not a positive whole number", s, count)
	}
	if window != "" && unicode.IsLetter(rune(window[0])) {
		window = "1" + window
	}
	d, err := time.ParseDuration(window)
	if err != nil || d < time.Millisecond {
		return leakybucket.Limit{}, fmt.Errorf("limit %q: window %q is not a duration of at least 1ms, as 30m or 1h", s, window)
	}
	return leakybucket.Per(n, d), nil
}

// strategyFlag is -strategy.
type strategyFlag struct {
	text     string
	strategy leakybucket.Strategy
}

func (f *strategyFlag) String() string { return f.text }

// Set parses logs, sortedset, windows:<precision>, windows:fixed or gcra.
func (f *strategyFlag) Set(s string) error {
	st, err := parseStrategy(s)
	if err != nil {
		return err
	}
	*f = strategyFlag{text: s, strategy: st}
	return nil
}

// parseStrategy parses logs, sortedset, windows:fixed (FixedWindows),
// gcra or windows:<precision>, as windows:1s. New checks the precision against the
// rules' windows.
func parseStrategy(s string) (leakybucket.Strategy, error) {
	switch s {
	case "logs":
		return leakybucket.Logs, nil
	case "sortedset":
		return leakybucket.SortedSet, nil
	case "windows:fixed":
		return leakybucket.FixedWindows, nil
	case "gcra":
		return leakybucket.GCRA, nil
	}
	precision, ok := strings.CutPrefix(s, "windows:")
	if !ok {
		return nil, fmt.Errorf("unknown strategy %q: want logs, sortedset, windows:<precision> (as windows:1s), windows:fixed or gcra", s)
	}
	d, err := time.ParseDuration(precision)
	if err != nil || d < time.Millisecond {
		return nil, fmt.Errorf("strategy %q: precision %q is not a duration of at least 1ms", s, precision)
	}
	return leakybucket.Windows(d), nil
}
