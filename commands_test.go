package leakybucket

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/acl"
)

// The Redis commands a Bucket sends, by strategy and method: the one list
// that everything about least privilege is checked against.
//
//   - Every behaviour test logs what its Bucket's client sends (commandLog)
//     and fails on a command not listed for its strategy.
//   - On the real Redis and the real cluster, that client authenticates as
//     the ACL user of its strategy, which may run only these commands
//     (acl_test.go): a command missing here fails the suite with NOPERM, or,
//     where the library ignores the error, by the ACL LOG check of TestMain.
//   - TestCommandsPerMethod drives each method down each of its paths and
//     checks that it sends exactly its list.
//   - The README's least-privilege section is rendered from these lists, and
//     TestReadmeLeastPrivilege fails until the README matches them.
//
// Names are as in ACL rules: lower case, "container|subcommand".

// The lists themselves live in internal/acl, which leakybucket
// doctor reads too; the names below are the tests' views of them.

// A method of a Bucket, as the table of docs/least-privilege.md names it.
type method = acl.Method

const (
	allowMethod    = acl.Allow
	peekMethod     = acl.Peek
	flushMethod    = acl.Flush
	flushAllMethod = acl.FlushAll
)

var (
	methods          = acl.Methods
	lockCommands     = acl.Lock
	txnCommands      = acl.Txn
	strategyCommands = sendsOf(acl.Strategies)
	clusterCommands  = acl.Cluster
	strategyNames    = acl.Names
	connCommands     = connsOf(acl.Conns)
	replicaCommands  = acl.Replicas
)

// sends is what one method of one strategy sends (acl.Sends).
type sends struct {
	lock     bool     // the lock's commands too
	commands []string // the strategy's reads (TIME included), then writes
	onLoss   []string // sent only after a reply was lost (see txn.resolve)
}

func sendsOf(all map[string]map[method]acl.Sends) map[string]map[method]sends {
	out := map[string]map[method]sends{}
	for s, byMethod := range all {
		out[s] = map[method]sends{}
		for m, c := range byMethod {
			out[s][m] = sends{lock: c.Lock, commands: c.Commands, onLoss: c.OnLoss}
		}
	}
	return out
}

// connCommand is a command go-redis itself sends on each new connection
// (acl.Conn).
type connCommand struct {
	name    string
	when    string // for the README
	grant   bool   // an ACL rule must allow it (HELLO, with AUTH, needs none)
	where   string // for the README: on which servers the rule applies, if not all
	cluster bool   // only on a *redis.ClusterClient
	paste   bool   // in the README's ACL SETUSER lines, which Redis 7.0 must accept
	instead string // the command it stands in for where that is refused (acl.Conn.Instead)
}

func connsOf(all []acl.Conn) []connCommand {
	out := make([]connCommand, len(all))
	for i, c := range all {
		out[i] = connCommand{name: c.Name, when: c.When, grant: c.Grant, where: c.Where, cluster: c.Cluster, paste: c.Paste, instead: c.Instead}
	}
	return out
}

// isConnCommand reports whether name is among connCommands.
func isConnCommand(name string) bool {
	return slices.ContainsFunc(connCommands, func(c connCommand) bool { return c.name == name })
}

// strategyName names s as strategyCommands does.
func strategyName(s Strategy) string {
	switch s.(type) {
	case logsStrategy:
		return "logs"
	case sortedSetStrategy:
		return "sortedset"
	case windowsStrategy:
		return "windows"
	case gcraStrategy:
		return "gcra"
	}
	panic(fmt.Sprintf("strategy %v is not in strategyCommands", s))
}

// methodCommands returns what method m of strategy s sends, the lock's
// commands first, on a cluster client or not.
func methodCommands(s string, m method, cluster bool) []string {
	return acl.OfMethod(s, m, cluster)
}

// strategyCommandsAll returns every command a Bucket of strategy s sends,
// whatever the method.
func strategyCommandsAll(s string, cluster bool) []string { return acl.OfStrategy(s, cluster) }

// grants returns the connection commands a user needs rules for.
func grants(cluster bool) []string { return acl.Grants(cluster) }

// allowed returns every command the client of a Bucket of strategy s may
// send: the strategy's, and go-redis's own on connecting.
func allowed(s string, cluster bool) map[string]bool {
	set := map[string]bool{}
	for _, c := range strategyCommandsAll(s, cluster) {
		set[c] = true
	}
	for _, c := range connCommands {
		if cluster || !c.cluster {
			set[c.name] = true
		}
	}
	return set
}

// aclRules returns the ACL rules that allow exactly cmds: every category
// off, then each command on.
func aclRules(cmds []string) []string {
	rules := []string{"-@all"}
	for _, c := range cmds {
		rules = append(rules, "+"+c)
	}
	return rules
}

func unique(cmds []string) []string { return acl.Unique(cmds) }

// commandName names a command as ACL rules do: a container command with
// its subcommand, as "client|setinfo".
func commandName(cmd redis.Cmder) string {
	name := cmd.Name()
	switch name {
	case "acl", "client", "cluster", "command", "config", "function", "memory", "object", "script":
		if args := cmd.Args(); len(args) > 1 {
			if sub, ok := args[1].(string); ok {
				return name + "|" + strings.ToLower(sub)
			}
		}
	}
	return name
}

// commandLog is a hook that logs every command its client sends, by name.
type commandLog struct {
	mu   sync.Mutex
	sent []string
}

func (l *commandLog) add(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, cmd := range cmds {
		l.sent = append(l.sent, commandName(cmd))
	}
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.add(cmds...)
		return next(ctx, cmds)
	}
}

// during returns the distinct commands sent while f ran, leaving out those
// of go-redis's connection handshake.
func (l *commandLog) during(f func()) []string {
	l.mu.Lock()
	from := len(l.sent)
	l.mu.Unlock()
	f()
	l.mu.Lock()
	defer l.mu.Unlock()
	var cmds []string
	for _, c := range l.sent[from:] {
		if !isConnCommand(c) {
			cmds = append(cmds, c)
		}
	}
	return unique(cmds)
}

// unexpected returns the commands sent that strategy s may not send.
func (l *commandLog) unexpected(s string, cluster bool) []string {
	ok := allowed(s, cluster)
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for _, c := range l.sent {
		if !ok[c] {
			bad = append(bad, c)
		}
	}
	return unique(bad)
}

// all returns the distinct commands sent so far.
func (l *commandLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return unique(l.sent)
}

// Each method sends exactly what commands_test.go lists for it. Every
// method runs down each of its paths, for rules per resource, per client and
// both, and WithRecordDenied: Allow with intervals to prune and a weight that saturates a Windows
// interval, Flush of a client that shares an interval with another, FlushAll
// of a resource with keys left. Each call may send only its method's
// commands; on miniredis, whose fake time makes the paths certain, the calls
// of a method must send all of them together. On the real servers, go-redis
// must send the connection commands listed.
func TestCommandsPerMethod(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "commands")
		ctx := context.Background()
		s := strategyName(e.strategy)
		_, cluster := e.rdb.(*redis.ClusterClient)
		sent := map[method][]string{}
		record := func(m method, call string, f func() error) {
			t.Helper()
			var err error
			cmds := e.sent.during(func() { err = f() })
			if err != nil {
				t.Fatalf("%s: %v", call, err)
			}
			want := methodCommands(s, m, cluster)
			for _, c := range cmds {
				if !slices.Contains(want, c) {
					t.Errorf("%s sent %s, which is not listed for %s", call, strings.ToUpper(c), m)
				}
			}
			sent[m] = unique(append(sent[m], cmds...))
		}
		allow := func(b *Bucket, client string, n int) {
			t.Helper()
			record(allowMethod, fmt.Sprintf("AllowN(%s, %d)", client, n), func() error {
				_, err := b.AllowN(ctx, "r", client, n)
				return err
			})
		}
		limit := Per(3, 200*time.Millisecond)
		for _, rules := range []struct {
			name string
			opts []Option
		}{
			{"per-resource", []Option{PerResource(limit)}},
			{"per-client", []Option{PerClient(limit)}},
			{"both", []Option{PerResource(limit), PerClient(limit)}},
			{"recorded", []Option{PerClient(limit), WithRecordDenied()}},
		} {
			opts := append(rules.opts, WithPrefix(e.prefix+":"+rules.name))
			b, elsewhere := e.bucket(t, opts...), e.bucket(t, opts...)
			// First, as a fresh Bucket has no estimate of Redis's clock.
			record(peekMethod, "Peek", func() error { _, err := b.Peek(ctx, "r", "a"); return err })
			allow(b, "a", 1)
			allow(b, "b", 1)
			time.Sleep(150 * time.Millisecond)
			allow(b, "a", 1)
			time.Sleep(100 * time.Millisecond) // the first two left the window
			allow(b, "b", 1)
			allow(elsewhere, "a", 2) // as another process: b does not see it
			allow(b, "a", 1)         // denied, not foreseen: taken back, and Windows deletes the dead intervals with it
			if rules.name != "per-resource" || s != "windows" {
				record(flushMethod, "Flush", func() error { return b.Flush(ctx, "r", "a") })
			}
			record(flushAllMethod, "FlushAll", func() error { return b.FlushAll(ctx, "r") })
		}
		// The slot guard guards what carries no key: every Peek, and a
		// FlushAll without the lock (every rule per-client).
		for m, cmds := range clusterCommands[s] {
			for _, c := range cmds {
				if cluster && !slices.Contains(sent[m], c) {
					t.Errorf("%s on a cluster never sent %s", m, strings.ToUpper(c))
				}
			}
		}
		if e.mini != nil {
			for _, m := range methods {
				for _, c := range methodCommands(s, m, false) {
					if !slices.Contains(sent[m], c) && !slices.Contains(strategyCommands[s][m].onLoss, c) {
						t.Errorf("%s never sent %s, which is listed for it", m, strings.ToUpper(c))
					}
				}
			}
		}
		if e.real {
			db := 0
			if rdb, ok := e.rdb.(*redis.Client); ok {
				db = rdb.Options().DB
			}
			for _, c := range connCommands {
				if c.name == "select" && db == 0 || c.cluster && !cluster || c.instead != "" && slices.Contains(e.sent.all(), c.instead) {
					continue // not needed here, or a fallback of one that went through
				}
				if !slices.Contains(e.sent.all(), c.name) {
					t.Errorf("go-redis never sent %s, which is listed as sent on connecting", c.name)
				}
			}
		}
	})
}
