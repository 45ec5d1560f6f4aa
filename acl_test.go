package leakybucket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/acl"
)

// Least privilege, proven. Before the tests, TestMain creates on the real
// Redis, and on each master of the real cluster, one ACL user per strategy
// that may run only the commands commands_test.go lists for it, and go-redis's
// own on connecting, on the tests' keys only:
//
//	ACL SETUSER lbtest-<run>-<strategy> reset on ><password> ~lbtest:* resetchannels -@all +set +unwatch ...
//
// Every Bucket of the real-Redis behaviour suite (the redis and cluster
// halves of each, and the tests that use newRealEnv, realClient or
// clusterClient) runs as the user of its strategy; the tests' own commands go
// through an admin client. After the tests, TestMain fails the run if the
// ACL LOG holds any command refused to those users, since the library
// ignores some errors (the cleanup's UNWATCH, go-redis's CLIENT SETINFO),
// and deletes the users.

// aclKeys is the key pattern of the users: every test prefix starts with it
// (uniquePrefix).
const aclKeys = "~lbtest:*"

// testUsers names the users and their password, unique to the run.
var testUsers = func() struct{ prefix, password string } {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	return struct{ prefix, password string }{"lbtest-" + id[:8], id}
}()

// userOf names the ACL user of strategy s (a name in strategyCommands).
func userOf(s string) string { return testUsers.prefix + "-" + s }

// replicaUserOf names the ACL user of strategy s for a Bucket
// WithReplicas: the user of s, plus WAIT (acl.Replicas).
func replicaUserOf(s string) string { return userOf(s) + "-replicas" }

// libraryOptions returns the options of a Bucket's client on the real Redis
// at addr, as the ACL user of strategy s.
func libraryOptions(addr, s string, poolSize int) *redis.Options {
	return &redis.Options{Addr: addr, DB: realDB, Username: userOf(s), Password: testUsers.password, PoolSize: poolSize}
}

// userCommands returns the commands the user of strategy s may run on rdb:
// the strategy's and the connection's that need a grant, less the
// subcommands rdb does not know (Redis 7.0 has no CLIENT SETINFO, and
// refuses a rule that names it).
func userCommands(ctx context.Context, rdb *redis.Client, s string, cluster bool) ([]string, error) {
	cmds := strategyCommandsAll(s, cluster)
	for _, c := range grants(cluster) {
		known, err := knownCommand(ctx, rdb, c)
		if err != nil {
			return nil, err
		}
		if known {
			cmds = append(cmds, c)
		}
	}
	return unique(cmds), nil
}

// knownCommand reports whether rdb's server has the command (or
// container|subcommand) name.
func knownCommand(ctx context.Context, rdb *redis.Client, name string) (bool, error) {
	return acl.Known(ctx, rdb, name)
}

// setUser creates or resets user with exactly cmds.
func setUser(ctx context.Context, rdb *redis.Client, user string, cmds []string) error {
	args := []any{"acl", "setuser", user, "reset", "on", ">" + testUsers.password, aclKeys, "resetchannels"}
	for _, r := range aclRules(cmds) {
		args = append(args, r)
	}
	if err := rdb.Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("%s: %v: %w", rdb.Options().Addr, args[:3], err)
	}
	return nil
}

// createTestUsers creates the users of every strategy on rdb, a standalone
// server or a cluster's master: the strategy's, and its user for a Bucket
// WithReplicas.
func createTestUsers(ctx context.Context, rdb *redis.Client, cluster bool) error {
	for _, s := range strategyNames {
		cmds, err := userCommands(ctx, rdb, s, cluster)
		if err != nil {
			return err
		}
		if err := setUser(ctx, rdb, userOf(s), cmds); err != nil {
			return err
		}
		if err := setUser(ctx, rdb, replicaUserOf(s), append(cmds, replicaCommands...)); err != nil {
			return err
		}
	}
	return nil
}

// deleteTestUsers deletes the users, and reports what the ACL LOG holds
// against them.
func deleteTestUsers(ctx context.Context, rdb *redis.Client) error {
	err := refusedToTestUsers(ctx, rdb)
	for _, s := range strategyNames {
		if derr := rdb.Do(ctx, "acl", "deluser", userOf(s), replicaUserOf(s)).Err(); derr != nil {
			err = errors.Join(err, fmt.Errorf("%s: ACL DELUSER: %w", rdb.Options().Addr, derr))
		}
	}
	return err
}

// refusedToTestUsers returns an error listing every entry of the ACL LOG
// about a test user: a command, key or channel refused to it.
func refusedToTestUsers(ctx context.Context, rdb *redis.Client) error {
	entries, err := rdb.ACLLog(ctx, 1000).Result()
	if err != nil {
		return fmt.Errorf("%s: ACL LOG: %w", rdb.Options().Addr, err)
	}
	var refused []string
	for _, e := range entries {
		if strings.HasPrefix(e.Username, testUsers.prefix+"-") {
			refused = append(refused, fmt.Sprintf("%s: %s %q (%s, %d times)", e.Username, e.Reason, e.Object, e.Context, e.Count))
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%s refused the test users, whose rules come from commands_test.go:\n\t%s",
			rdb.Options().Addr, strings.Join(refused, "\n\t"))
	}
	return nil
}

// dangerous are commands no user of the limiter needs, of which the tests
// check that the users are denied.
var dangerous = [][]any{
	{"eval", "return 1", "0"},
	{"evalsha", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"},
	{"fcall", "f", "0"},
	{"function", "flush"},
	{"script", "flush"},
	{"flushall"},
	{"flushdb"},
	{"keys", "*"},
	{"config", "set", "maxmemory", "1"},
	{"acl", "setuser", "x"},
	{"info"},
	{"monitor"},
	{"shutdown"},
}

// dryRunArgs returns arguments for ACL DRYRUN of command name (a command or
// container|subcommand) that make as many arguments as it needs, each a key
// of the tests.
func dryRunArgs(ctx context.Context, rdb *redis.Client, name string) ([]any, error) {
	return acl.DryRunArgs(ctx, rdb, name, "lbtest:key")
}

// The users are as narrow as commands_test.go says: each may run its own
// strategy's commands on the tests' keys, and nothing else: not another
// strategy's commands, not a key outside the tests' prefix, not a script,
// nor FLUSHALL, KEYS, CONFIG, ACL, INFO, MONITOR or SHUTDOWN. ACL DRYRUN
// checks the users themselves without running anything (a refusal would
// land in the ACL LOG that TestMain checks); a user made by the same code
// then actually sends FLUSHALL, KEYS, CONFIG and a GET outside the prefix,
// and gets NOPERM.
func TestACLUsersAreRestrictive(t *testing.T) {
	t.Parallel()
	addr := realAddrOrSkip(t)
	ctx := context.Background()
	admin := realAdmin(t)
	var every []string
	for _, s := range strategyNames {
		every = append(every, strategyCommandsAll(s, true)...)
	}
	every = append(every, grants(true)...)
	every = append(every, replicaCommands...) // only for a Bucket WithReplicas
	every = unique(every)
	dryRun := func(user string, args ...any) (bool, error) {
		verdict, err := admin.ACLDryRun(ctx, user, args...).Result()
		if err != nil {
			return false, fmt.Errorf("ACL DRYRUN %s %v: %w", user, args, err)
		}
		return verdict == "OK", nil
	}
	for _, s := range strategyNames {
		t.Run(s, func(t *testing.T) {
			user := userOf(s)
			mine, err := userCommands(ctx, admin, s, false)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range every {
				if known, err := knownCommand(ctx, admin, c); err != nil || !known {
					continue // Redis 7.0 has no CLIENT SETINFO
				}
				args, err := dryRunArgs(ctx, admin, c)
				if err != nil {
					t.Fatal(err)
				}
				ok, err := dryRun(user, args...)
				if err != nil {
					t.Fatal(err)
				}
				if want := slices.Contains(mine, c); ok != want {
					t.Errorf("%s may run %v: %v, want %v", user, args, ok, want)
				}
			}
			for _, args := range dangerous {
				if ok, err := dryRun(user, args...); err != nil || ok {
					t.Errorf("%s may run %v: %v, %v; want refused", user, args, ok, err)
				}
			}
			// A command of the strategy's own, on a key outside the
			// prefix, then inside.
			if ok, err := dryRun(user, "del", defaultPrefix+":{x}:lock"); err != nil || ok {
				t.Errorf("%s may write a key outside %s: %v, %v", user, aclKeys, ok, err)
			}
			if ok, err := dryRun(user, "del", "lbtest:{x}:lock"); err != nil || !ok {
				t.Errorf("%s may not write a test key: %v, %v", user, ok, err)
			}
			// WAIT only for the user of a Bucket WithReplicas (the loop
			// above checks that the strategy's own user may not).
			if ok, err := dryRun(replicaUserOf(s), "wait", "1", "0"); err != nil || !ok {
				t.Errorf("%s may not run WAIT: %v, %v", replicaUserOf(s), ok, err)
			}

			// The same rules, for a user of this test alone: its refusals
			// go to the ACL LOG under a name TestMain does not look for.
			// (Scripts only by DRYRUN: TestMain fails the run if INFO
			// commandstats shows any script command, refused or not.)
			probe := "lbprobe-" + testUsers.prefix + "-" + s
			if err := setUser(ctx, admin, probe, mine); err != nil {
				t.Fatal(err)
			}
			defer admin.Do(ctx, "acl", "deluser", probe)
			opts := libraryOptions(addr, s, 1)
			opts.Username = probe
			rdb := redis.NewClient(opts)
			defer rdb.Close()
			if err := rdb.Del(ctx, "lbtest:probe:"+probe).Err(); err != nil {
				t.Fatalf("%s: DEL on a test key: %v", probe, err)
			}
			defer admin.Del(ctx, "lbtest:probe:"+probe)
			for _, args := range [][]any{{"flushall"}, {"keys", "*"}, {"config", "get", "maxmemory"}, {"get", defaultPrefix + ":{x}:lock"}} {
				if ok, err := dryRun(probe, args...); err != nil || ok {
					t.Errorf("%s may run %v: %v, %v; not trying it", probe, args, ok, err)
					continue
				}
				if err := rdb.Do(ctx, args...).Err(); !redis.IsPermissionError(err) {
					t.Errorf("%s ran %v: error %v, want NOPERM", probe, args, err)
				}
			}
		})
	}
}

// testACLSetup creates the test users on the real Redis and on each master
// of the real cluster, as far as their addresses are set, and returns what
// deletes them and reports refusals after the tests.
func testACLSetup(ctx context.Context) (teardown func() error, err error) {
	type server struct {
		rdb     *redis.Client
		cluster bool
	}
	var servers []server
	if addr := realAddr(); addr != "" {
		servers = append(servers, server{redis.NewClient(&redis.Options{Addr: addr}), false})
	}
	if addrs := os.Getenv(clusterAddrsVar); addrs != "" {
		for _, addr := range strings.Split(addrs, ",") {
			servers = append(servers, server{redis.NewClient(&redis.Options{Addr: addr}), true})
		}
	}
	teardown = func() error {
		var err error
		for _, s := range servers {
			err = errors.Join(err, deleteTestUsers(ctx, s.rdb))
			s.rdb.Close()
		}
		return err
	}
	for _, s := range servers {
		if err := createTestUsers(ctx, s.rdb, s.cluster); err != nil {
			return teardown, err
		}
	}
	return teardown, nil
}

// The ACL SETUSER lines of the least-privilege page are ready to paste: the
// real Redis accepts each (renamed, so as not to touch a real user), and the
// user it makes may run its strategy's commands on the default prefix and
// nothing else.
func TestReadmeACLLinesWork(t *testing.T) {
	t.Parallel()
	realAddrOrSkip(t)
	ctx := context.Background()
	admin := realAdmin(t)
	doc, err := os.ReadFile(leastPrivilegeDoc)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for line := range strings.SplitSeq(string(doc), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "ACL" || fields[1] != "SETUSER" || !strings.HasPrefix(fields[2], "leakybucket-") {
			continue
		}
		found++
		s := strings.TrimPrefix(fields[2], "leakybucket-")
		if _, ok := strategyCommands[s]; !ok {
			t.Errorf("%s: line for an unknown strategy %q: %s", leastPrivilegeDoc, s, line)
			continue
		}
		user := "lbreadme-" + testUsers.prefix + "-" + s
		args := []any{"acl", "setuser", user}
		for _, f := range fields[3:] {
			args = append(args, f)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Errorf("%s: the line for %s: %v", leastPrivilegeDoc, s, err)
			continue
		}
		defer admin.Do(ctx, "acl", "deluser", user)
		for _, c := range strategyCommandsAll(s, true) {
			cmd, err := dryRunArgs(ctx, admin, c)
			if err != nil {
				t.Fatal(err)
			}
			for i := range cmd {
				if cmd[i] == "lbtest:key" {
					cmd[i] = defaultPrefix + ":{r}:key"
				}
			}
			if ok, err := admin.ACLDryRun(ctx, user, cmd...).Result(); err != nil || ok != "OK" {
				t.Errorf("%s: the user for %s may not run %v: %v, %v", leastPrivilegeDoc, s, cmd, ok, err)
			}
		}
		for _, cmd := range append(dangerous, []any{"get", "lbtest:key"}) {
			if ok, err := admin.ACLDryRun(ctx, user, cmd...).Result(); err != nil || ok == "OK" {
				t.Errorf("%s: the user for %s may run %v: %v, %v", leastPrivilegeDoc, s, cmd, ok, err)
			}
		}
	}
	if found != len(strategyNames) {
		t.Errorf("%s has %d ACL SETUSER lines, want one per strategy (%d)", leastPrivilegeDoc, found, len(strategyNames))
	}
}
