package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/leakybucket/leakybucket"
)

// Exit codes of run.
const (
	exitOK    = 0
	exitRedis = 1 // Redis failed or did not answer in time
	exitUsage = 2 // bad input: nothing was sent to Redis
	exitFail  = 3 // doctor: a check FAILed
)

// A usageError is bad input: a flag, an argument or a subcommand that the
// command cannot run with. It is found before anything is sent to Redis.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// run is the command: args without the program's name, the output and the
// diagnostics. It returns the exit code: exitOK, exitRedis, exitUsage or exitFail.
func run(args []string, stdout, stderr io.Writer) int {
	g := newGlobals()
	top := newFlagSet("leakybucket", stderr)
	g.register(top)
	if err := top.Parse(args); err != nil {
		return parseFailed(err, "leakybucket -h", stdout, stderr, topUsage)
	}
	if top.NArg() == 0 {
		fmt.Fprintln(stderr, "leakybucket: no subcommand (run leakybucket -h)")
		return exitUsage
	}
	name, rest := subcommand(top.Args())
	if name == "help" {
		return help(rest, stdout, stderr)
	}
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "leakybucket: unknown subcommand %q (run leakybucket -h; limits takes set, get or show)\n", name)
		return exitUsage
	}
	return cmd.execute(g, rest, stdout, stderr)
}

// subcommand splits the arguments after the global flags into the
// subcommand's name, two words for those of limits ("limits set"), and
// its own arguments.
func subcommand(args []string) (string, []string) {
	if args[0] == "limits" && len(args) > 1 {
		return "limits " + args[1], args[2:]
	}
	return args[0], args[1:]
}

// help prints the top-level help, or one subcommand's, on stdout.
func help(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		topUsage(stdout)
		return exitOK
	}
	name, rest := subcommand(args)
	cmd, ok := lookup(name)
	if !ok || len(rest) > 0 {
		fmt.Fprintf(stderr, "leakybucket help: want one subcommand, got %q (run leakybucket -h)\n", args)
		return exitUsage
	}
	cmd.usage(stdout)
	return exitOK
}

// newFlagSet returns a flag set that reports its errors on stderr and
// prints no usage by itself: parseFailed does.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {}
	return fs
}

// parseFailed handles an error of FlagSet.Parse, which has already printed
// it on stderr, unless it is a request for help: then usage goes to stdout.
// helpCmd is the command line that prints the help.
func parseFailed(err error, helpCmd string, stdout, stderr io.Writer, usage func(io.Writer)) int {
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "run %s for usage\n", helpCmd)
	return exitUsage
}

// report prints err, if any, and returns its exit code: exitUsage for bad
// input, whether the command or the library found it (the library checks
// its input before sending anything), else exitRedis.
func report(stderr io.Writer, name string, err error) int {
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "leakybucket %s: %v\n", name, err)
	if badInput(err) {
		fmt.Fprintf(stderr, "run leakybucket %s -h for usage\n", name)
		return exitUsage
	}
	if errors.Is(err, errChecksFailed) {
		return exitFail
	}
	return exitRedis
}

// badInput reports whether err is bad input rather than a failure of Redis.
func badInput(err error) bool {
	var u usageError
	return errors.As(err, &u) ||
		errors.Is(err, leakybucket.ErrInvalidOption) ||
		errors.Is(err, leakybucket.ErrInvalidWeight) ||
		errors.Is(err, leakybucket.ErrEmptyResource) ||
		errors.Is(err, leakybucket.ErrEmptyClient) ||
		errors.Is(err, leakybucket.ErrUnknownTier)
}
