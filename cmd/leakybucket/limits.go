package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/leakybucket/leakybucket"
)

// The limits subcommands read and change the rules a leakybucket.Tiers
// keeps in Redis (WithSharedLimits): "limits set", "limits get" and
// "limits show", each one subcommand named by two words.
var (
	limitsSetCommand = command{
		name:     "limits set",
		synopsis: "limits set -tier T (with -client-limit and -resource-limit)",
		summary:  "change a tier's limits in every process that shares them (Tiers.SetLimits)",
		detail: `Makes the rules given with -client-limit and -resource-limit, in the order of
the tier's rules, the limits of tier T in Redis: every process whose Tiers
shares its limits (WithSharedLimits) on -prefix decides by them within its
refresh interval (1s by default). Only the Requests of each rule may change:
the rules must have the tier's windows, precisions and scopes, so that every
count is kept (a lower limit denies at once what is over it, a higher one
admits at once). The tier must be in Redis, written there by a process
that shares its limits; -strategy must be the service's (logs or windows:
the other strategies name their counts by the limit). Bad input writes
nothing and exits 2.`,
		bind: func(fs *flag.FlagSet) action {
			a := &limitsSet{}
			fs.StringVar(&a.tier, "tier", "", "the `tier` (required)")
			return a
		},
		bucketless: true,
	}
	limitsGetCommand = command{
		name:     "limits get",
		synopsis: "limits get -tier T",
		summary:  "print a tier's limits in Redis, as the flags of limits set",
		detail: `Prints the rules that Redis holds for tier T (see limits set), as the
-client-limit and -resource-limit flags that set them. It only reads.`,
		bind: func(fs *flag.FlagSet) action {
			a := &limitsShow{}
			fs.StringVar(&a.tier, "tier", "", "the `tier` (required)")
			return a
		},
		bucketless: true,
	}
	limitsShowCommand = command{
		name:     "limits show",
		synopsis: "limits show",
		summary:  "print every tier's limits in Redis (Tiers.Limits)",
		detail: `Prints the rules that Redis holds for every tier under -prefix (see limits
set), one tier a line, as the flags that set them. It only reads.`,
		bind:       func(*flag.FlagSet) action { return &limitsShow{all: true} },
		bucketless: true,
	}
)

// limitsSet is "limits set".
type limitsSet struct{ tier string }

func (a *limitsSet) check(g *globals) error {
	switch {
	case a.tier == "":
		return usagef("-tier is required")
	case len(g.rules) == 0:
		return usagef("no rule: give the tier's new limits with -client-limit and -resource-limit, in the order of its rules")
	}
	return nil
}

func (a *limitsSet) do(ctx context.Context, s *session, stdout io.Writer) error {
	tiers, err := s.tiers()
	if err != nil {
		return err
	}
	if err := tiers.SetLimits(ctx, a.tier, s.g.rules...); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "tier %q: %s\n", a.tier, ruleFlags(s.g.rules))
	return nil
}

// tiers returns a Tiers of no tier of its own on the flags' prefix and
// strategy: it knows the tiers that the services wrote to Redis.
func (s *session) tiers() (*leakybucket.Tiers, error) {
	return leakybucket.NewTiers(s.rdb, leakybucket.WithPrefix(s.g.prefix), leakybucket.WithStrategy(s.g.strategy.strategy))
}

// limitsShow is "limits get" (one tier) and "limits show" (all).
type limitsShow struct {
	tier string
	all  bool
}

func (a *limitsShow) check(*globals) error {
	if !a.all && a.tier == "" {
		return usagef("-tier is required")
	}
	return nil
}

func (a *limitsShow) do(ctx context.Context, s *session, stdout io.Writer) error {
	tiers, err := s.tiers()
	if err != nil {
		return err
	}
	all, err := tiers.Limits(ctx)
	if err != nil {
		return err
	}
	names := slices.Sorted(maps.Keys(all))
	if !a.all {
		if _, ok := all[a.tier]; !ok {
			return fmt.Errorf("%w: %q: no limits in Redis under prefix %q", leakybucket.ErrUnknownTier, a.tier, s.g.prefix)
		}
		names = []string{a.tier}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIER\tLIMITS")
	for _, tier := range names {
		fmt.Fprintf(tw, "%s\t%s\n", tier, ruleFlags(all[tier]))
	}
	return tw.Flush()
}

// ruleFlags spells rules as the flags that give them, in order.
func ruleFlags(rules []leakybucket.Rule) string {
	flags := make([]string, len(rules))
	for i, r := range rules {
		name := "-resource-limit "
		if r.PerClient {
			name = "-client-limit "
		}
		flags[i] = name + formatLimit(r.Limit)
	}
	return strings.Join(flags, " ")
}
