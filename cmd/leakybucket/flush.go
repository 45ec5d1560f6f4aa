package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// flushCommand forgets a client's counts at a resource: Bucket.Flush.
var flushCommand = command{
	name:     "flush",
	synopsis: "flush -resource R [-client C]",
	summary:  "forget a client's counts at a resource (Bucket.Flush)",
	detail: `Forgets the counts of client C at resource R: its own, and its share of the
resource's, as Bucket.Flush does, under the same lock as a decision. -resource
is required; -client too when a rule is per-client.`,
	bind: func(fs *flag.FlagSet) action {
		f := &flush{}
		f.bind(fs, true)
		return f
	},
}

// flush is the flush subcommand.
type flush struct{ target }

func (f *flush) check(g *globals) error { return f.target.check(g.perClient()) }

func (f *flush) do(ctx context.Context, s *session, stdout io.Writer) error {
	if err := s.bucket.Flush(ctx, f.resource, f.client); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(stdout, "flushed client %q at resource %q\n", f.client, f.resource); err != nil {
		return err
	}
	return s.warnIfNoKey(ctx)
}

// flushAllCommand forgets every count of a resource: Bucket.FlushAll.
var flushAllCommand = command{
	name:     "flush-all",
	synopsis: "flush-all -resource R",
	summary:  "forget every count of a resource, for all clients (Bucket.FlushAll)",
	detail: `Forgets every count of resource R, for all clients and rules, as
Bucket.FlushAll does. -resource is required. Unless the strategy is sortedset
with a per-resource rule, it finds the keys with SCAN, which walks the whole
database.`,
	bind: func(fs *flag.FlagSet) action {
		f := &flushAll{}
		f.bind(fs, false)
		return f
	},
}

// flushAll is the flush-all subcommand.
type flushAll struct{ target }

func (f *flushAll) check(*globals) error { return f.target.check(false) }

func (f *flushAll) do(ctx context.Context, s *session, stdout io.Writer) error {
	if err := s.bucket.FlushAll(ctx, f.resource); err != nil {
		return err
	}
	_, err := fmt.Fprintf(stdout, "flushed every count of resource %q\n", f.resource)
	return err
}
