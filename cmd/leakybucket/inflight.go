package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/leakybucket/leakybucket/inflight"
)

// inFlightCommand shows what an inflight.Limiter holds at a resource.
var inFlightCommand = command{
	name:     "inflight",
	synopsis: "inflight -resource R -limit N [-lease-prefix P]",
	summary:  "show how much an in-flight limiter holds at a resource, and by whom (inflight.Limiter.Held)",
	detail: `Shows the leases of an in-flight limiter (package inflight) at resource R:
the weight held against its per-resource limit N, how many wait in line, and
each live lease's client, weight, id (for Limiter.Release) and deadline, in
Redis's clock. -resource and -limit are required; -lease-prefix is the
Limiter's WithPrefix (default "` + inflight.DefaultPrefix + `"). It only reads.`,
	bind: func(fs *flag.FlagSet) action {
		a := &inFlight{}
		fs.StringVar(&a.resource, "resource", "", "the `resource`")
		fs.IntVar(&a.limit, "limit", 0, "the Limiter's per-resource `limit` (PerResource)")
		fs.StringVar(&a.prefix, "lease-prefix", inflight.DefaultPrefix, "the Limiter's key `prefix` (WithPrefix)")
		return a
	},
	bucketless: true,
}

// inFlight is the inflight subcommand.
type inFlight struct {
	resource, prefix string
	limit            int
}

func (a *inFlight) check(*globals) error {
	switch {
	case a.resource == "":
		return usagef("-resource is required")
	case a.limit < 1:
		return usagef("-limit is required: the Limiter's per-resource limit")
	}
	return nil
}

func (a *inFlight) do(ctx context.Context, s *session, stdout io.Writer) error {
	l, err := inflight.New(s.rdb, inflight.PerResource(a.limit), inflight.WithPrefix(a.prefix))
	if err != nil {
		return err
	}
	u, err := l.Held(ctx, a.resource)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resource %q: %d of %d held, %d waiting\n", a.resource, u.Held, u.Limit, u.Waiters)
	if len(u.Holders) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tWEIGHT\tDEADLINE\tID")
	for _, h := range u.Holders {
		fmt.Fprintf(tw, "%q\t%d\t%s\t%s\n", h.Client, h.Weight, h.Deadline.UTC().Format(time.RFC3339Nano), h.ID)
	}
	return tw.Flush()
}
