// Package acl lists the Redis commands that a Bucket sends, by
// strategy and method: the one list that the tests check the library
// against (commands_test.go in the root package drives every method and
// fails on a command not listed here), that the tests' ACL users are made
// from, that the README's least-privilege section is rendered from, and
// that leakybucket doctor checks a user against with ACL DRYRUN.
//
// Names are as in ACL rules: lower case, "container|subcommand".
package acl

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Method of a Bucket, as the table of docs/least-privilege.md names it.
type Method string

// The methods.
const (
	Allow    Method = "Allow"
	Peek     Method = "Peek"
	Flush    Method = "Flush"
	FlushAll Method = "FlushAll"
)

// Methods are the methods, in the README's order.
var Methods = []Method{Allow, Peek, Flush, FlushAll}

// Lock is what the lock sends: SET NX PXAT takes it, with TIME to keep the
// estimate of Redis's clock, UNWATCH starts each attempt, WATCH and GET
// fence it, and MULTI ... DEL ... EXEC releases it with the writes. A
// waiter claims to be next in line with SET NX PX and reads the claim with
// GET; the holder that was next clears it with DEL. The background release
// sends WATCH, GET, TIME, then MULTI, DEL, EXEC or UNWATCH.
var Lock = []string{"set", "unwatch", "watch", "get", "multi", "del", "exec", "time"}

// Sends is what one method of one strategy sends.
type Sends struct {
	Lock     bool     // the lock's commands too
	Commands []string // the strategy's reads (TIME included), then writes
	OnLoss   []string // sent only after a reply was lost
}

// Txn is what a transaction sends around its commands; a marked one
// (Windows') also SETs its marker. After a lost reply the Bucket waits for
// Redis to answer: PING, or GET of the marker.
var Txn = []string{"multi", "exec"}

// Strategies are the commands by strategy (see Names) and method.
// SortedSet and Windows decide in one transaction, and send TIME alone
// once, for the first estimate of Redis's clock.
var Strategies = map[string]map[Method]Sends{
	"logs": {
		Allow:    {true, []string{"scan", "time", "set"}, nil},
		Peek:     {false, []string{"scan", "time"}, nil},
		Flush:    {true, []string{"scan", "time", "del"}, nil},
		FlushAll: {true, []string{"scan", "del"}, nil},
	},
	"sortedset": {
		Allow: {false, append(slices.Clone(Txn), "time", "zremrangebyscore", "zcard", "zrange", "zadd",
			"zremrangebyrank", "pexpire", "zrem"), []string{"ping"}},
		Peek:     {false, []string{"time", "zcount", "zrangebyscore", "zrange"}, nil},
		Flush:    {false, []string{"zrange", "multi", "del", "zrem", "exec"}, nil},
		FlushAll: {false, []string{"scan", "del"}, nil},
	},
	"windows": {
		Allow: {false, append(slices.Clone(Txn), "set", "time", "get", "hincrby", "hsetnx", "hget", "hgetall", "pexpireat",
			"hdel", "watch"), []string{"unwatch", "hset"}},
		Peek:     {false, []string{"time", "get", "hgetall"}, nil},
		Flush:    {false, []string{"time", "multi", "hgetall", "del", "get", "exec", "hincrby", "pexpireat", "set", "hdel"}, []string{"watch", "unwatch", "hset"}},
		FlushAll: {false, []string{"scan", "multi", "incr", "pexpire", "del", "exec"}, nil},
	},
	// GCRA: WATCH, PEXPIRETIME, GET and TIME, then MULTI, SET, EXEC, or
	// UNWATCH when nothing is to write. Flush and FlushAll SET a new
	// generation, which Refund reads (Allow's WATCH and GET).
	"gcra": {
		Allow:    {false, append(slices.Clone(Txn), "watch", "pexpiretime", "get", "time", "set", "unwatch"), nil},
		Peek:     {false, []string{"pexpiretime", "get", "time"}, nil},
		Flush:    {false, []string{"multi", "set", "del", "exec"}, nil},
		FlushAll: {false, []string{"set", "scan", "del"}, nil},
	},
}

// Replicas is what Allow also sends under WithReplicas, whatever the
// strategy: WAIT, after each decision's EXEC. Only then does the user
// need it.
var Replicas = []string{"wait"}

// Names are the keys of Strategies, in the README's order.
var Names = []string{"logs", "sortedset", "windows", "gcra"}

// Cluster is what a method also sends on a *redis.ClusterClient, by
// strategy: the slot guard of reads that carry no key.
var Cluster = map[string]map[Method][]string{
	"logs":      {Peek: {"exists"}, FlushAll: {"exists"}},
	"sortedset": {FlushAll: {"exists"}},
	"windows":   {FlushAll: {"exists"}},
	"gcra":      {Peek: {"exists"}, FlushAll: {"exists"}},
}

// A Conn is a command go-redis (v9.24) itself sends on each new
// connection, before any of the library's.
type Conn struct {
	Name    string
	When    string // for the README
	Grant   bool   // an ACL rule must allow it (HELLO, with AUTH, needs none)
	Where   string // for the README: on which servers the rule applies, if not all
	Cluster bool   // only on a *redis.ClusterClient
	Paste   bool   // in the README's ACL SETUSER lines, which Redis 7.0 must accept
	// Instead names the command this one stands in for, sent only where
	// that one is refused or missing; "" if it is always sent.
	Instead string
}

// Conns are the connection's commands.
var Conns = []Conn{
	{"hello", "every new connection; it carries `AUTH`", false, "", false, false, ""},
	{"select", "`DB` in `redis.Options` is not 0", true, "", false, true, ""},
	{"client|maint_notifications", "every new connection, unless `MaintNotificationsConfig` disables it; once refused, go-redis stops sending it", true,
		"where the server has it (open-source Redis 7 does not)", false, false, ""},
	{"client|setinfo", "every new connection, unless `DisableIdentity`; go-redis ignores a refusal", true,
		"on Redis 7.2 and later (7.0 refuses the rule)", false, false, ""},
	{"cluster|shards", "a `*redis.ClusterClient`, to map the slots (go-redis v9.24 asks it first)", true, "", true, true, ""},
	{"cluster|slots", "a `*redis.ClusterClient`, to map the slots where `CLUSTER SHARDS` is refused or missing", true, "", true, true, "cluster|shards"},
}

// OfMethod returns what method m of strategy s sends, the lock's commands
// first, on a cluster client or not.
func OfMethod(s string, m Method, cluster bool) []string {
	sent := Strategies[s][m]
	var cmds []string
	if sent.Lock {
		cmds = append(cmds, Lock...)
	}
	cmds = append(cmds, sent.Commands...)
	cmds = append(cmds, sent.OnLoss...)
	if cluster {
		cmds = append(cmds, Cluster[s][m]...)
	}
	return Unique(cmds)
}

// OfStrategy returns every command a Bucket of strategy s sends, whatever
// the method.
func OfStrategy(s string, cluster bool) []string {
	var cmds []string
	for _, m := range Methods {
		cmds = append(cmds, OfMethod(s, m, cluster)...)
	}
	return Unique(cmds)
}

// Grants returns the connection commands a user needs rules for.
func Grants(cluster bool) []string {
	var cmds []string
	for _, c := range Conns {
		if c.Grant && (cluster || !c.Cluster) {
			cmds = append(cmds, c.Name)
		}
	}
	return cmds
}

// Unique returns cmds without repeats, in their first order.
func Unique(cmds []string) []string {
	var out []string
	for _, c := range cmds {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// Known reports whether rdb's server has the command (or
// container|subcommand) name: Redis 7.0 has no CLIENT SETINFO, say.
func Known(ctx context.Context, rdb *redis.Client, name string) (bool, error) {
	info, err := rdb.Do(ctx, "command", "info", name).Slice()
	if err != nil {
		return false, fmt.Errorf("COMMAND INFO %s: %w", name, err)
	}
	return len(info) == 1 && info[0] != nil, nil
}

// DryRunArgs returns arguments for ACL DRYRUN of command name (a command
// or container|subcommand): the name, then key as often as its arity
// needs.
func DryRunArgs(ctx context.Context, rdb *redis.Client, name, key string) ([]any, error) {
	info, err := rdb.Do(ctx, "command", "info", name).Slice()
	switch {
	case err != nil:
		return nil, fmt.Errorf("COMMAND INFO %s: %w", name, err)
	case len(info) != 1 || info[0] == nil:
		return nil, fmt.Errorf("COMMAND INFO %s: no such command", name)
	}
	fields, ok := info[0].([]any)
	if !ok || len(fields) < 2 {
		return nil, fmt.Errorf("COMMAND INFO %s: %v", name, info[0])
	}
	arity, _ := fields[1].(int64)
	var args []any
	for part := range strings.SplitSeq(name, "|") {
		args = append(args, part)
	}
	for len(args) < int(max(arity, -arity)) {
		args = append(args, key)
	}
	return args, nil
}
