package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leakybucket/leakybucket"
	"github.com/leakybucket/leakybucket/internal/acl"
	"github.com/redis/go-redis/v9"
)

// doctorCommand checks the Redis server for what the Bucket of the flags
// needs.
var doctorCommand = command{
	name:     "doctor",
	synopsis: "doctor [-replicas N]",
	summary:  "check the server for what the limiter needs: eviction, memory, persistence, replication, ACL...",
	detail: `Checks the Redis server (each master of a -cluster) for what the Bucket of the
global flags needs, and prints one line per check: OK, WARN or FAIL, the
reason and the fix. It checks the eviction policy (allkeys-* evicts counts:
FAIL; volatile-* evicts keys with a TTL, which every strategy sets: WARN),
the memory headroom, persistence (none: counts are lost on restart), the
replication role, replicas and lag (a failover loses the counts of the last
lag, unless the service waits for its replicas: WithReplicas), that the
-redis user may run every command of the -strategy (ACL DRYRUN; WAIT too
with -replicas), whether scripting is allowed (for information), for
-strategy logs the database size and the time a decision's SCAN takes on
it, and the cluster state. -replicas N says that the service passes N to
WithReplicas: then each primary must have at least N replicas online
(-strategy gcra refuses it, as GCRA refuses WithReplicas). Under gcra
the server must also have PEXPIRETIME (Redis 7.0 or later). A
check that the user may not run (CONFIG, INFO or ACL denied) says so, as a
WARN. Rules are not needed. Each server is first dialed once, within a
second: a refused connection, an unknown host or a refused user is
reported at once. Exit status 0 if nothing FAILs, 3 if a check
FAILs.`,
	bind: func(fs *flag.FlagSet) action {
		d := &doctor{}
		fs.IntVar(&d.replicas, "replicas", 0, "the `N` of the service's WithReplicas(N, timeout): how many replicas must acknowledge each decision (0: the service does not wait for replicas)")
		return d
	},
	bucketless: true,
}

// errChecksFailed: a check of doctor FAILed.
var errChecksFailed = errors.New("a check failed")

// Verdicts of a check.
const (
	levelOK   = "OK"
	levelWarn = "WARN"
	levelFail = "FAIL"
)

// A verdict is one check's line.
type verdict struct{ level, check, text string }

// doctor is the doctor subcommand.
type doctor struct {
	replicas int // -replicas: the service's WithReplicas
}

func (d *doctor) check(g *globals) error {
	if d.replicas < 0 {
		return usagef("-replicas %d: want 0 or more", d.replicas)
	}
	if d.replicas > 0 && !canWait(g) {
		return usagef("-replicas %d: the %s strategy refuses WithReplicas (a TAT written cannot be taken back once others read it)", d.replicas, g.strategy.text)
	}
	return nil
}

// canWait reports whether the Bucket of g may wait for replicas
// (WithReplicas): GCRA refuses it.
func canWait(g *globals) bool { return g.strategy.strategy != leakybucket.GCRA }

func (d *doctor) do(ctx context.Context, s *session, stdout io.Writer) error {
	if err := dialSeeds(ctx, s.rdb); err != nil {
		return err
	}
	nodes, err := masters(ctx, s.rdb)
	if err != nil {
		return err
	}
	failed := 0
	for _, node := range nodes {
		if err := dialOnce(ctx, node.Options()); err != nil {
			return err
		}
		where := ""
		if len(nodes) > 1 {
			where = node.Options().Addr + " "
		}
		for _, v := range s.examine(ctx, node, d.replicas) {
			if v.level == levelFail {
				failed++
			}
			fmt.Fprintf(stdout, "%-4s  %s%s: %s\n", v.level, where, v.check, v.text)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d FAIL", errChecksFailed, failed)
	}
	return nil
}

// dialTimeout bounds doctor's first dial of a server, and its PING: a
// server that is there answers in milliseconds, one that refuses the
// connection (or whose host is unknown, or that refuses the user) says so
// at once, and go-redis's own retries would spend -timeout before they
// say it, or say only that the deadline passed.
const dialTimeout = time.Second

// dialOnce connects to the server of opt and sends PING, once, without
// go-redis's retries, within dialTimeout (and ctx): the error names the
// address and keeps the dial's cause (refused, unknown host, auth).
func dialOnce(ctx context.Context, opt *redis.Options) error {
	once := *opt
	once.DialerRetries, once.MaxRetries, once.PoolSize, once.MinIdleConns = 1, -1, 1, 0
	once.DialTimeout = dialTimeout
	rdb := redis.NewClient(&once)
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("%s: %w", opt.Addr, err)
	}
	return nil
}

// dialSeeds dials the nodes of -cluster (dialOnce) before the cluster
// client asks them for its masters, which it would retry until -timeout:
// an error if none answers, the first one's. A single server is dialed
// with the masters.
func dialSeeds(ctx context.Context, rdb redis.UniversalClient) error {
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	opt := c.Options()
	var first error
	for _, addr := range opt.Addrs {
		err := dialOnce(ctx, &redis.Options{Addr: addr, Username: opt.Username, Password: opt.Password, TLSConfig: opt.TLSConfig})
		if err == nil {
			return nil
		}
		first = cmp.Or(first, err)
	}
	return first
}

// masters returns the client of each master: rdb itself, or each master
// of a cluster.
func masters(ctx context.Context, rdb redis.UniversalClient) ([]*redis.Client, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		return []*redis.Client{c}, nil
	case *redis.ClusterClient:
		var mu sync.Mutex
		var nodes []*redis.Client
		err := c.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes = append(nodes, node)
			return nil
		})
		slices.SortFunc(nodes, func(a, b *redis.Client) int { return strings.Compare(a.Options().Addr, b.Options().Addr) })
		return nodes, err
	}
	return nil, fmt.Errorf("unsupported client %T", rdb)
}

// examine runs every check on node, for a service whose decisions wait
// for replicas replicas (WithReplicas).
func (s *session) examine(ctx context.Context, node *redis.Client, replicas int) []verdict {
	strategy := strategyName(s.g.strategy.text)
	_, cluster := s.rdb.(*redis.ClusterClient)
	user := s.user()
	own := acl.OfStrategy(strategy, cluster)
	sends := append(slices.Clone(own), acl.Grants(cluster)...)
	if replicas > 0 {
		sends = append(sends, acl.Replicas...)
	}
	return []verdict{
		checkPolicy(ctx, node),
		checkMemory(ctx, node),
		checkPersistence(ctx, node),
		checkReplication(ctx, node, replicas, canWait(s.g)),
		checkACL(ctx, node, user, strategy, s.g.prefix, sends, own),
		checkScripting(ctx, node, user),
		checkLogsSize(ctx, node, strategy),
		checkCluster(ctx, node, cluster),
	}
}

// strategyName is the name of a -strategy in the command lists: logs,
// sortedset or windows.
func strategyName(flag string) string {
	name, _, _ := strings.Cut(flag, ":")
	return name
}

// user is the ACL user of -redis: "default" unless named.
func (s *session) user() string {
	if opt, err := redis.ParseURL(s.g.redisURL); err == nil && opt.Username != "" {
		return opt.Username
	}
	return "default"
}

// cannot is the verdict of a check that could not run.
func cannot(check, what string, err error) verdict {
	return verdict{levelWarn, check, fmt.Sprintf("cannot check: %s: %v (run doctor as a user allowed it, or check by hand)", what, err)}
}

// config returns the value of a CONFIG GET parameter.
func config(ctx context.Context, node *redis.Client, param string) (string, error) {
	m, err := node.ConfigGet(ctx, param).Result()
	if err != nil {
		return "", err
	}
	v, ok := m[param]
	if !ok {
		return "", fmt.Errorf("no parameter %q", param)
	}
	return v, nil
}

// info returns the fields of an INFO section.
func info(ctx context.Context, node *redis.Client, section string) (map[string]string, error) {
	text, err := node.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for line := range strings.SplitSeq(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

func checkPolicy(ctx context.Context, node *redis.Client) verdict {
	const check = "maxmemory-policy"
	policy, err := config(ctx, node, check)
	switch {
	case err != nil:
		return cannot(check, "CONFIG GET maxmemory-policy", err)
	case strings.HasPrefix(policy, "allkeys-"):
		return verdict{levelFail, check, policy + " evicts the limiter's counts under memory pressure, and clients pass their limits (measured: 60 of 60); fix: CONFIG SET maxmemory-policy noeviction, or a Redis of its own"}
	case strings.HasPrefix(policy, "volatile-"):
		return verdict{levelWarn, check, policy + " evicts keys with a TTL, and every strategy sets one on its keys (measured under Logs: +300 over 600 allowed); fix: CONFIG SET maxmemory-policy noeviction, or a Redis of its own"}
	}
	return verdict{levelOK, check, policy + ": counts are never evicted (a full server refuses writes with OOM instead)"}
}

func checkMemory(ctx context.Context, node *redis.Client) verdict {
	const check = "memory"
	f, err := info(ctx, node, "memory")
	if err != nil {
		return cannot(check, "INFO memory", err)
	}
	used, _ := strconv.ParseInt(f["used_memory"], 10, 64)
	limit, _ := strconv.ParseInt(f["maxmemory"], 10, 64)
	if limit == 0 {
		return verdict{levelWarn, check, fmt.Sprintf("%s used, no maxmemory: the host's memory is the limit, and the OOM killer's restart loses every count; fix: CONFIG SET maxmemory below the host's memory", mb(used))}
	}
	share := float64(used) / float64(limit)
	text := fmt.Sprintf("%s used of maxmemory %s (%.0f %%)", mb(used), mb(limit), 100*share)
	switch {
	case share >= 0.95:
		return verdict{levelFail, check, text + ": writes are about to fail (noeviction) or counts to be evicted; fix: raise maxmemory, or move other data away"}
	case share >= 0.8:
		return verdict{levelWarn, check, text + ": little headroom; fix: raise maxmemory, or move other data away"}
	}
	return verdict{levelOK, check, text}
}

func mb(bytes int64) string { return fmt.Sprintf("%.1f MB", float64(bytes)/(1<<20)) }

func checkPersistence(ctx context.Context, node *redis.Client) verdict {
	const check = "persistence"
	aof, err := config(ctx, node, "appendonly")
	if err != nil {
		return cannot(check, "CONFIG GET appendonly", err)
	}
	save, err := config(ctx, node, "save")
	if err != nil {
		return cannot(check, "CONFIG GET save", err)
	}
	switch {
	case aof == "yes":
		return verdict{levelOK, check, "AOF on: a restart keeps the counts (up to the last fsync)"}
	case strings.TrimSpace(save) != "":
		return verdict{levelWarn, check, "RDB snapshots only (save " + save + "): a restart loses the counts written since the last snapshot; fix: CONFIG SET appendonly yes"}
	}
	return verdict{levelWarn, check, "none: a restart loses every count (a client at 5/5 gets 5 more); fix: CONFIG SET appendonly yes, or accept a window of over-admission per restart"}
}

// checkReplication checks the server's role, its replicas and their lag,
// for a service whose decisions wait for want replicas (WithReplicas; 0:
// none), and that may wait for them if canWait.
func checkReplication(ctx context.Context, node *redis.Client, want int, canWait bool) verdict {
	const check = "replication"
	f, err := info(ctx, node, "replication")
	if err != nil {
		return cannot(check, "INFO replication", err)
	}
	if f["role"] != "master" {
		return verdict{levelFail, check, fmt.Sprintf("this server is a replica of %s:%s (link %s): the Bucket must write to the primary, and writes here fail with READONLY; fix: point -redis (and the service) at the primary",
			f["master_host"], f["master_port"], f["master_link_status"])}
	}
	n, _ := strconv.Atoi(f["connected_slaves"])
	online, lag := replicasOf(f, n)
	level, text := replicationVerdict(want, n, online, lag, canWait)
	return verdict{level, check, text}
}

// replicationVerdict judges a primary with n replicas, online of them
// online, lagging up to lag seconds, for a service that waits for want,
// and may wait for them if canWait.
func replicationVerdict(want, n, online, lag int, canWait bool) (string, string) {
	has := fmt.Sprintf("primary with %d replica(s), %d online, lag up to %ds", n, online, lag)
	switch {
	case want > online:
		return levelFail, fmt.Sprintf("%s: the service waits for %d (WithReplicas), so every decision would wait out its timeout and fail with ErrUnavailable; fix: bring replicas online, or set WithReplicas (and -replicas) to what this primary has", has, want)
	case want > 0 && want < n:
		return levelWarn, fmt.Sprintf("%s: each decision waits for %d of them (WithReplicas), so a failover that promotes one of the other %d, which may not have acknowledged, loses their counts (Sentinel and a cluster prefer the replica that received the most, but not always); fix: WithReplicas(%d, timeout), every replica", has, want, n-want, n)
	case want > 0:
		return levelOK, fmt.Sprintf("%s: each decision waits for every replica to acknowledge it (WithReplicas), so a failover to one of them keeps every admitted call (WAIT is not consensus: a replica that lost its data since still loses counts)", has)
	case n == 0:
		return levelOK, "primary without replicas: no failover can lose counts (a restart can: see persistence)"
	case !canWait:
		return levelWarn, fmt.Sprintf("%s: replication is asynchronous, so a failover now would lose the buckets' levels of about the last %ds, letting each client be admitted again for what it was admitted in that time; the gcra strategy cannot wait for replicas (WithReplicas); fix: CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 1, which bound the lag",
			has, max(lag, 1))
	}
	return levelWarn, fmt.Sprintf("%s: replication is asynchronous, so a failover now would lose the counts of about the last %ds, letting each client be admitted again for what it was admitted in that time (measured: 1 s behind, 38-40 %% over-admission); fix: WithReplicas(%d, timeout) in the service, and -replicas %d here, so that a call is admitted only once the replicas hold it; or CONFIG SET min-replicas-to-write 1 and min-replicas-max-lag 1, which bound the lag rather than close it",
		has, max(lag, 1), n, n)
}

// replicasOf reads the n lines slave0, slave1, ... of INFO replication:
// how many are online, and the largest lag=N.
func replicasOf(f map[string]string, n int) (online, worst int) {
	for i := range n {
		for kv := range strings.SplitSeq(f["slave"+strconv.Itoa(i)], ",") {
			if v, ok := strings.CutPrefix(kv, "lag="); ok {
				lag, _ := strconv.Atoi(v)
				worst = max(worst, lag)
			}
			if kv == "state=online" {
				online++
			}
		}
	}
	return online, worst
}

// checkACL checks that user may run every command of cmds, those the
// Bucket of strategy sends, on keys under prefix, and that the server has
// each command of own, the strategy's own (PEXPIRETIME is Redis 7.0's);
// of the others, one the server lacks is one go-redis copes without.
func checkACL(ctx context.Context, node *redis.Client, user, strategy, prefix string, cmds, own []string) verdict {
	const check = "acl"
	var denied, missing []string
	for _, name := range acl.Unique(cmds) {
		allowed, known, err := dryRun(ctx, node, user, prefix, name)
		switch {
		case err != nil:
			var step stepError
			errors.As(err, &step)
			return cannot(check, step.step, step.err)
		case !known && slices.Contains(own, name):
			missing = append(missing, name)
		case known && !allowed:
			denied = append(denied, name)
		}
	}
	if len(missing) > 0 {
		return verdict{levelFail, check, fmt.Sprintf("this server has no %s, which the %s strategy sends; fix: Redis 7.0 or later",
			strings.ToUpper(strings.Join(missing, " ")), strategy)}
	}
	if len(denied) > 0 {
		return verdict{levelFail, check, fmt.Sprintf("user %q may not run %s, which the %s strategy sends; fix: ACL SETUSER %s +%s (docs/least-privilege.md lists every command)",
			user, strings.ToUpper(strings.Join(denied, " ")), strategy, user, strings.Join(denied, " +"))}
	}
	return verdict{levelOK, check, fmt.Sprintf("user %q may run every command the %s strategy sends, on keys under %q", user, strategy, prefix+":")}
}

// A stepError is the error err of the command step ("ACL DRYRUN").
type stepError struct {
	step string
	err  error
}

func (e stepError) Error() string { return e.step + ": " + e.err.Error() }
func (e stepError) Unwrap() error { return e.err }

// wrapAs returns err, if any, as the error of step.
func wrapAs(step string, err error) error {
	if err == nil {
		return nil
	}
	return stepError{step, err}
}

// dryRun reports whether the server knows command name and, if it does,
// whether user may run it on a key under prefix (ACL DRYRUN). Its error
// is a stepError naming the command that failed: COMMAND INFO or ACL
// DRYRUN.
func dryRun(ctx context.Context, node *redis.Client, user, prefix, name string) (allowed, known bool, err error) {
	if known, err = acl.Known(ctx, node, name); err != nil || !known {
		return false, false, wrapAs("COMMAND INFO", err)
	}
	args, err := acl.DryRunArgs(ctx, node, name, prefix+":{doctor}")
	if err != nil {
		return false, true, wrapAs("COMMAND INFO", err)
	}
	reply, err := node.Do(ctx, append([]any{"acl", "dryrun", user}, args...)...).Text()
	if err != nil {
		return false, true, wrapAs("ACL DRYRUN", err)
	}
	return reply == "OK", true, nil
}

func checkScripting(ctx context.Context, node *redis.Client, user string) verdict {
	const check = "scripting"
	reply, err := node.Do(ctx, "acl", "dryrun", user, "eval", "return 1", "0").Text()
	switch {
	case err != nil:
		return cannot(check, "ACL DRYRUN", err)
	case reply == "OK":
		return verdict{levelOK, check, fmt.Sprintf("allowed for user %q (for information: the limiter sends no script)", user)}
	}
	return verdict{levelOK, check, fmt.Sprintf("denied for user %q (for information: the limiter sends no script)", user)}
}

// lockTTL is WithLockTTL's default, which a Logs decision must finish
// within.
const lockTTL = 2 * time.Second

// scanPerKey is what SCAN costs per key it walks, COUNT 1000 (measured:
// a full iteration of 1 M keys took 0.75 s, of 100 k 25-50 ms).
const scanPerKey = 750 * time.Nanosecond

func checkLogsSize(ctx context.Context, node *redis.Client, strategy string) verdict {
	const check = "database size"
	if strategy != "logs" {
		return verdict{levelOK, check, strategy + " costs the same whatever the size of the database"}
	}
	n, err := node.DBSize(ctx).Result()
	if err != nil {
		return cannot(check, "DBSIZE", err)
	}
	took := time.Duration(n) * scanPerKey
	text := fmt.Sprintf("%d keys: each Logs decision walks them all with SCAN, about %v", n, took.Round(10*time.Microsecond))
	fix := "; fix: keep the limiter's keys in a database of their own (-redis .../N), or use sortedset or windows"
	switch {
	case took >= lockTTL/2:
		return verdict{levelFail, check, text + ", near the lock TTL (" + lockTTL.String() + "): decisions will fail with ErrLockExpired" + fix}
	case took >= 10*time.Millisecond:
		return verdict{levelWarn, check, text + fix}
	}
	return verdict{levelOK, check, text}
}

func checkCluster(ctx context.Context, node *redis.Client, cluster bool) verdict {
	const check = "cluster"
	f, err := info(ctx, node, "cluster")
	if err != nil {
		return cannot(check, "INFO cluster", err)
	}
	enabled := f["cluster_enabled"] == "1"
	switch {
	case !enabled && !cluster:
		return verdict{levelOK, check, "not a cluster"}
	case enabled && !cluster:
		return verdict{levelFail, check, "the server is a cluster node: give its nodes with -cluster, as the service must use a ClusterClient"}
	case !enabled:
		return verdict{levelFail, check, "-cluster names a server that is not a cluster node"}
	}
	state, err := node.ClusterInfo(ctx).Result()
	if err != nil {
		return cannot(check, "CLUSTER INFO", err)
	}
	if !strings.Contains(state, "cluster_state:ok") {
		return verdict{levelFail, check, "cluster_state is not ok: some slots are not served; fix: see redis-cli --cluster check"}
	}
	return verdict{levelOK, check, "cluster_state:ok"}
}
