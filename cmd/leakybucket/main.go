// Command leakybucket looks at and clears the counts that a
// leakybucket.Bucket keeps in Redis, for operators who do not write Go:
// peek prints how much of each rule a (resource, client) has used and when
// it frees, flush forgets a client's counts at a resource and flush-all
// every count of a resource; limits set changes a leakybucket.Tiers'
// limits in every process that shares them (WithSharedLimits), and limits
// get and limits show print them.
//
// Give it the same prefix, strategy and rules as the service's Bucket: the
// keys are named after the strategy, the longest window and the precision,
// so a Bucket made otherwise reads and deletes other keys.
//
//	leakybucket -redis redis://localhost:6379/0 -resource-limit 100/30m -client-limit 10/1m \
//		peek -resource /api/search -client alice
//
// Run leakybucket -h for the subcommands, and leakybucket <subcommand> -h
// for each one's flags.
package main

import (
	"os"

	"github.com/redis/go-redis/v9"
)

func main() {
	redis.SetLogger(quietLogger{}) // run reports each failure once, with its cause
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
