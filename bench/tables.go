package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// A table is one table of BENCHMARKS.md: how it is measured, and how its
// rows are reported. Each is made by tableOf in the file of what it
// measures; benchTables lists them in the order they run and print.
type table struct {
	name    string // for -table
	heading string // on stdout
	measure func(*runner, context.Context, *results) error

	measured     func(results) bool
	markdown     func(config, results) string
	section      func(*strings.Builder, config, results)
	targets      func(config, results) []target
	prose        func(*strings.Builder, config, results)
	overAdmitted func(results) []string
}

// report is how a table whose rows are R is measured and reported: each
// part after measure is given the run's config and the table's rows, at
// least one.
type report[R any] struct {
	measure  func(*runner, context.Context) ([]R, error) // the rows, in order
	markdown func(config, []R) string                    // the table alone, for stdout
	title    string                                      // its section's heading in BENCHMARKS.md
	method   func(config, []R) string                    // how it was measured, before the table
	notes    func(config, []R) string                    // nil: nothing after the table
	targets  func(config, []R) []target                  // nil: it judges none
	prose    func(*strings.Builder, config, []R)         // nil: nothing in "Where the time goes"
	checked  string                                      // the table's name in a failed check; "" for none
	check    func(R) (where, check string, bad bool)     // nil: its rows are not checked
}

// tableOf binds a report to the rows of results it measures and reads.
func tableOf[R any](name, heading string, rowsOf func(*results) *[]R, rep report[R]) table {
	rows := func(res results) []R { return *rowsOf(&res) }
	return table{
		name: name, heading: heading,
		measure: func(r *runner, ctx context.Context, res *results) (err error) {
			*rowsOf(res), err = rep.measure(r, ctx)
			return err
		},
		measured: func(res results) bool { return len(rows(res)) > 0 },
		markdown: func(cfg config, res results) string { return rep.markdown(cfg, rows(res)) },
		section:  func(b *strings.Builder, cfg config, res results) { rep.section(b, cfg, rows(res)) },
		targets: func(cfg config, res results) []target {
			if rep.targets == nil {
				return nil
			}
			return rep.targets(cfg, rows(res))
		},
		prose: func(b *strings.Builder, cfg config, res results) {
			if rep.prose != nil {
				rep.prose(b, cfg, rows(res))
			}
		},
		overAdmitted: func(res results) []string { return overAdmitted(rep, rows(res)) },
	}
}

// section writes the table's section of BENCHMARKS.md: its heading, its
// method, the table and its notes.
func (rep report[R]) section(b *strings.Builder, cfg config, rows []R) {
	fmt.Fprintf(b, "## %s\n\n%s\n\n%s\n", rep.title, rep.method(cfg, rows), rep.markdown(cfg, rows))
	if rep.notes != nil {
		b.WriteString(rep.notes(cfg, rows))
	}
}

// overAdmitted names the rows whose check found an over-admission.
func overAdmitted[R any](rep report[R], rows []R) []string {
	if rep.check == nil {
		return nil
	}
	var bad []string
	for _, r := range rows {
		where, check, v := rep.check(r)
		if !v {
			continue
		}
		if rep.checked != "" {
			where = rep.checked + ", " + where
		}
		bad = append(bad, where+": "+check)
	}
	return bad
}

// benchTables are the tables, in the order they are measured and
// reported; replicas is last: its replica stays attached to the library's
// server until it ends.
var benchTables = []table{throughputTable, steadyTable, hammerTable, noisyTable, abuserTable, procsTable,
	costTable, memoryTable, inProcessTable, inflightTable, contentionTable, replicasTable}

// tableNames are the tables' names, for -table.
func tableNames() []string {
	names := make([]string, len(benchTables))
	for i, t := range benchTables {
		names[i] = t.name
	}
	return names
}

// run measures every table that -table selects, in order.
func (r *runner) run(ctx context.Context) (results, error) {
	var res results
	for _, t := range benchTables {
		if !r.cfg.tables.MatchString(t.name) {
			continue
		}
		if err := t.measure(r, ctx, &res); err != nil {
			return res, fmt.Errorf("%s table: %w", t.name, err)
		}
	}
	return res, nil
}

// measuredTables are the tables res has rows of.
func measuredTables(res results) []table {
	return filter(benchTables, func(t table) bool { return t.measured(res) })
}

// violations is an error naming every row where a limiter admitted more
// than its limit allows.
func violations(res results) error {
	var bad []string
	for _, t := range measuredTables(res) {
		bad = append(bad, t.overAdmitted(res)...)
	}
	if len(bad) > 0 {
		return errors.New("a limiter admitted more than its limit:\n  " + strings.Join(bad, "\n  "))
	}
	return nil
}
