package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket"
)

// peekCommand prints the state of each rule for a (resource, client).
var peekCommand = command{
	name:     "peek",
	synopsis: "peek -resource R [-client C] [-n N]",
	summary:  "print each rule's used/limit, remaining, retry after and reset after",
	detail: `Prints, for each rule, what client C has used at resource R now out of the
rule's limit, the room that is left, how long until a call of weight N fits
(retry after; 0s if it fits now, never if N is above the rule's limit) and how
long until every call the rule counts has left its window (reset after); then
whether Allow would admit a call of weight N now. Under -strategy gcra each
rule is a leaky bucket: used/burst is the weight in it out of its burst, and
empty in how long until it has drained (its theoretical arrival time). It records nothing and takes no lock. -resource is required;
-client too when a rule is per-client.`,
	bind: func(fs *flag.FlagSet) action {
		p := &peek{}
		p.bind(fs, true)
		fs.IntVar(&p.n, "n", 1, "the weight `N` of the call to ask about, as AllowN's n")
		return p
	},
}

// peek is the peek subcommand.
type peek struct {
	target
	n int
}

func (p *peek) check(g *globals) error { return p.target.check(g.perClient()) }

func (p *peek) do(ctx context.Context, s *session, stdout io.Writer) error {
	res, err := s.bucket.PeekN(ctx, p.resource, p.client, p.n)
	if err != nil {
		return err
	}
	// PeekN reports the rules as if its call were counted when it would be
	// admitted: Usage reports them as they are.
	now, err := s.bucket.Usage(ctx, p.resource, p.client)
	if err != nil {
		return err
	}
	for i := range now {
		now[i].RetryAfter = res.Rules[i].RetryAfter
	}
	res.Rules = now
	if err := printRules(stdout, res, s.g.strategy.strategy == leakybucket.GCRA); err != nil {
		return err
	}
	return s.warnIfNoKey(ctx)
}

// printRules prints res as a table of its rules, then whether it admits.
// Under GCRA (buckets) a rule's limit is its burst, and its reset after
// is when the bucket is empty.
func printRules(w io.Writer, res leakybucket.Result, buckets bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "rule\tused/limit\tremaining\tretry after\treset after"
	if buckets {
		header = "rule\tused/burst\tremaining\tretry after\tempty in"
	}
	fmt.Fprintln(tw, header)
	for _, rr := range res.Rules {
		fmt.Fprintf(tw, "%s\t%d/%d\t%d\t%s\t%v\n", ruleName(rr.Rule), rr.Used, quota(rr.Rule.Limit), rr.Remaining, retryAfter(rr.RetryAfter), rr.ResetAfter)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "would allow: %t\n", res.Allowed)
	return err
}

// quota is the most weight l admits at once: its burst under GCRA, if it
// has one, else Requests.
func quota(l leakybucket.Limit) int {
	if l.Burst != 0 {
		return l.Burst
	}
	return l.Requests
}

// retryAfter writes a rule's RetryAfter, or "never" for a weight above its
// limit (leakybucket.Never), which no wait admits.
func retryAfter(d time.Duration) string {
	if d == leakybucket.Never {
		return "never"
	}
	return d.String()
}

// ruleName names a rule as "per-client 10 per 1m", "per-client 10 per
// 1h (precision 1m)" or "per-client 10 per 1s (burst 50)": Rule.String without the zero units of the durations.
func ruleName(r leakybucket.Rule) string {
	scope := "per-resource"
	if r.PerClient {
		scope = "per-client"
	}
	name := fmt.Sprintf("%s %d per %s", scope, r.Limit.Requests, shortDuration(r.Limit.Window))
	if r.Limit.Precision != 0 {
		name += " (precision " + shortDuration(r.Limit.Precision) + ")"
	}
	if r.Limit.Burst != 0 {
		name += " (burst " + strconv.Itoa(r.Limit.Burst) + ")"
	}
	return name
}

// shortDuration formats d as time.Duration does, less trailing zero
// minutes and seconds: 30m, 1h, 1h30m, 1m30s, 1.5s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
