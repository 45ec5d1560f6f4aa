package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
)

// A command is a subcommand: its help, and its action with the flags of
// its own.
type command struct {
	name     string
	synopsis string // the subcommand's own flags, as in "peek -resource R"
	summary  string // one line, for leakybucket -h
	detail   string // paragraphs, for leakybucket <name> -h
	bind     func(fs *flag.FlagSet) action
	// bucketless: the subcommand needs the client only, no rule.
	bucketless bool
}

// An action is what a subcommand does, given its parsed flags.
type action interface {
	// check reports bad input, before anything is sent to Redis.
	check(g *globals) error
	// do runs the subcommand; ctx bounds its calls to Redis.
	do(ctx context.Context, s *session, stdout io.Writer) error
}

// commands are the subcommands, in the order of the help.
var commands = []command{peekCommand, flushCommand, flushAllCommand, doctorCommand, inFlightCommand,
	limitsSetCommand, limitsGetCommand, limitsShowCommand}

// lookup returns the subcommand called name: one word, or two for the
// subcommands of limits ("limits set").
func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// flagSet returns the subcommand's flag set, bound to g and to the action
// it returns.
func (c command) flagSet(g *globals, stderr io.Writer) (*flag.FlagSet, action) {
	fs := newFlagSet("leakybucket "+c.name, stderr)
	act := c.bind(fs)
	g.register(fs)
	return fs, act
}

// execute parses the subcommand's flags (after the global ones, parsed into
// g) and runs it. It returns the exit code.
func (c command) execute(g *globals, args []string, stdout, stderr io.Writer) int {
	fs, act := c.flagSet(g, stderr)
	if err := fs.Parse(args); err != nil {
		return parseFailed(err, "leakybucket "+c.name+" -h", stdout, stderr, c.usage)
	}
	return report(stderr, c.name, c.run(g, fs.Args(), act, stdout, stderr))
}

// run checks the input, then runs act within the timeout; warnings go to
// stderr.
func (c command) run(g *globals, extra []string, act action, stdout, stderr io.Writer) error {
	if len(extra) > 0 {
		return usagef("unexpected argument %q: every input is a flag", extra[0])
	}
	if err := act.check(g); err != nil {
		return err
	}
	s, err := g.open(!c.bucketless)
	if err != nil {
		return err
	}
	defer s.rdb.Close()
	s.stderr = stderr
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	return act.do(ctx, s, stdout)
}

// usage prints the subcommand's help and flags, the global ones included.
func (c command) usage(w io.Writer) {
	fs, _ := c.flagSet(newGlobals(), w)
	fmt.Fprintf(w, "Usage: leakybucket [global flags] %s [flags]\n\n%s\n\nFlags (global ones too, before or after %s):\n", c.synopsis, c.detail, c.name)
	fs.PrintDefaults()
}

// topUsage prints the help of the command: its subcommands and global
// flags.
func topUsage(w io.Writer) {
	fmt.Fprint(w, `Usage: leakybucket [global flags] <subcommand> [flags]

Looks at and clears the counts that a leakybucket.Bucket keeps in Redis, and
changes the limits that a leakybucket.Tiers shares there. Give the same prefix,
strategy and rules as the service's Bucket: its keys are named after the
strategy, the longest window and the precision.

Subcommands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	fmt.Fprintf(tw, "  help [subcommand]\tthis help, or a subcommand's (as leakybucket <subcommand> -h)\n")
	tw.Flush()
	fmt.Fprint(w, "\nGlobal flags (before or after the subcommand):\n")
	fs := newFlagSet("leakybucket", w)
	newGlobals().register(fs)
	fs.PrintDefaults()
	fmt.Fprint(w, `
Exit status: 0 on success, 1 if Redis failed or did not answer within
-timeout, 2 for bad input (then nothing was written to Redis, and nothing sent
but limits' read of the tier), 3 if a check
of doctor FAILed.

Example:
  leakybucket -redis redis://localhost:6379/0 -resource-limit 100/30m \
    -client-limit 10/1m peek -resource /search -client alice
`)
}

// target is the resource and client a subcommand acts on.
type target struct{ resource, client string }

// bind defines -resource and, if withClient, -client.
func (t *target) bind(fs *flag.FlagSet, withClient bool) {
	fs.StringVar(&t.resource, "resource", "", "the `resource` (required)")
	if withClient {
		fs.StringVar(&t.client, "client", "", "the `client` (required when a rule is per-client)")
	}
}

// check requires a resource and, if needClient, a client.
func (t *target) check(needClient bool) error {
	switch {
	case t.resource == "":
		return usagef("-resource is required: name the resource explicitly (an empty one is refused)")
	case needClient && t.client == "":
		return usagef("-client is required: a rule is per-client")
	}
	return nil
}
