package leakybucket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// The behaviour suite runs every test against two servers:
//
//   - miniredis inside a testing/synctest bubble: time is fake, time.Sleep
//     returns at once, and every duration is exact to the millisecond;
//   - a real Redis whose user is denied scripting, at $LEAKYBUCKET_REDIS_ADDR
//     (`make test` starts one), and the real 3-master cluster
//     (cluster_test.go). There time is real and every call lands later than
//     the model says, by as much as a loaded machine likes: env.run times
//     each call and checks durations against what was measured, and a test
//     whose calls landed too late for its model to hold is run again on a
//     fresh prefix (see env.run).
//
// Without the address the real half is skipped, except under CI, where it
// fails: CI must never pass on miniredis alone.
//
// Each env has two clients. rdb is the Bucket's, and sends nothing else:
// every command it sends is logged and must be listed for the strategy in
// commands_test.go, and on the real servers it authenticates as an ACL user
// that may run those commands only (acl_test.go). admin is the test's own,
// as the default user, for whatever a test writes or inspects itself.

const redisAddrVar = "LEAKYBUCKET_REDIS_ADDR"

// scriptCommands are the commands the library must never send.
var scriptCommands = []string{"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro", "script", "function"}

type env struct {
	strategy Strategy
	rdb      redis.UniversalClient // the Bucket's: a *redis.Client, or a *redis.ClusterClient
	admin    redis.UniversalClient // the test's own, on the same server
	sent     *commandLog           // what rdb sent
	prefix   string                // unique to the test; every key it writes starts with it
	real     bool                  // a real Redis, on the real clock
	clock    modelClock            // the model's time, for run
	trips    *roundTrips
	mini     *miniredis.Miniredis // nil on a real Redis
	local    *[]*Bucket           // in process: the Buckets made, whose counts keys lists; else nil
}

// newLocalEnv returns an env whose Buckets keep their counts in process
// (NewLocal), on the fake time of the synctest bubble: it has no Redis,
// and no clients.
func newLocalEnv(s Strategy) *env {
	// trips and sent count nothing: nothing goes over a network.
	return &env{strategy: s, prefix: "t", clock: newModelClock(), local: &[]*Bucket{}, trips: &roundTrips{}, sent: &commandLog{}}
}

// needsRedis skips a test of what a Bucket keeps or sends in Redis, such as
// its keys or round trips, in an env without one (NewLocal's).
func (e *env) needsRedis(t *testing.T, what string) {
	t.Helper()
	if e.local != nil {
		t.Skip("in process there is no Redis: " + what)
	}
}

// bucket returns a Bucket on the test's prefix.
func (e *env) bucket(t *testing.T, opts ...Option) *Bucket {
	t.Helper()
	b, err := e.new(append([]Option{WithStrategy(e.strategy), WithPrefix(e.prefix)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// new returns New(e.rdb, opts...), or in process NewLocal(opts...).
func (e *env) new(opts ...Option) (*Bucket, error) {
	if e.local == nil {
		return New(e.rdb, opts...)
	}
	b, err := NewLocal(opts...)
	if err == nil {
		*e.local = append(*e.local, b)
	}
	return b, err
}

// keys returns every key that starts with the test's prefix.
func (e *env) keys(t *testing.T) []string {
	t.Helper()
	var all []string
	if e.local != nil {
		for _, b := range *e.local {
			all = append(all, localOf(b).counts.Keys()...)
		}
		return all
	}
	return keysUnder(t, e.admin, e.prefix)
}

// keysUnder returns every key under prefix.
func keysUnder(t testing.TB, admin redis.UniversalClient, prefix string) []string {
	t.Helper()
	var all []string
	err := forEachNode(admin, func(node *redis.Client) error {
		iter := node.Scan(context.Background(), 0, keys.MatchPrefix(prefix), 1000).Iterator()
		for iter.Next(context.Background()) {
			all = append(all, iter.Val())
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	return all
}

// countKeys returns the keys that hold counts: every key under the test's
// prefix but the fences of transactions (package txn), which expire within
// fenceLife+fenceDoneGrace, and Windows' generation (see windowsStore).
func (e *env) countKeys(t *testing.T) []string {
	t.Helper()
	return countsOnly(e.keys(t))
}

// heldFields reads a Windows hash's fields as a read counts them: each
// number with what the hash's pending fields add to it (written by a
// take-back sent again after a lost reply: see txn.Txn.Resend).
func heldFields(fields map[string]string) map[string]int {
	out := map[string]int{}
	for field, value := range fields {
		if n, err := strconv.Atoi(value); err == nil {
			out[field] += n
		} else if txn.IsPending(field) {
			for interval, w := range txn.Pending(value) {
				out[interval] += w
			}
		}
	}
	return out
}

// countsOnly leaves out of keys the fences and generations: see countKeys.
func countsOnly(keys []string) []string {
	return slices.DeleteFunc(keys, func(key string) bool {
		return strings.Contains(key, "}:fence:") || strings.HasSuffix(key, "}:gen")
	})
}

// addHook adds h to the client, and on a cluster to every master's client,
// which is where a Bucket sends its commands.
func (e *env) addHook(h redis.Hook) {
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(context.Background(), func(_ context.Context, node *redis.Client) error {
			node.AddHook(h)
			return nil
		})
		return
	}
	e.rdb.AddHook(h)
}

// forEachNode calls f with rdb, or on a cluster with each master's client,
// one at a time.
func forEachNode(rdb redis.UniversalClient, f func(*redis.Client) error) error {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return f(rdb.(*redis.Client))
	}
	var mu sync.Mutex
	return cc.ForEachMaster(context.Background(), func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return f(node)
	})
}

// strategies are the strategies every behaviour test runs with. Windows
// at a precision of 1ms is exact, so the tests' exact expectations hold for
// it too; strategy_test.go checks coarser precisions against their bound.
var strategies = []Strategy{Logs, SortedSet, Windows(time.Millisecond)}

// fillUnrelated writes n keys under the test's prefix that no Bucket reads.
func (e *env) fillUnrelated(t *testing.T, n int) {
	t.Helper()
	ctx := context.Background()
	pipe := e.admin.Pipeline()
	for i := range n {
		pipe.Set(ctx, fmt.Sprintf("%s:unrelated:%d", e.prefix, i), "x", time.Minute)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// each runs test with every strategy, against miniredis on fake time, in
// process (NewLocal) on fake time, the real Redis, and the real 3-master
// cluster.
func each(t *testing.T, test func(t *testing.T, e *env)) {
	t.Helper()
	eachOf(t, strategies, test)
}

// lockedStrategies are the strategies that decide under a lock: the lock's
// tests run with these only, as SortedSet and Windows take none.
var lockedStrategies = []Strategy{Logs}

// eachLocked is each, with the strategies that take a lock.
func eachLocked(t *testing.T, test func(t *testing.T, e *env)) {
	t.Helper()
	eachOf(t, lockedStrategies, func(t *testing.T, e *env) {
		e.needsRedis(t, "the lock is a Redis key")
		test(t, e)
	})
}

func eachOf(t *testing.T, strategies []Strategy, test func(t *testing.T, e *env)) {
	t.Helper()
	t.Parallel()
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("miniredis", func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					test(t, newMiniEnv(t, s))
				})
			})
			t.Run("local", func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					test(t, newLocalEnv(s))
				})
			})
			t.Run("redis", func(t *testing.T) {
				t.Parallel()
				onTime(t, func() *env { return newRealEnv(t, s) }, test)
			})
			t.Run("cluster", func(t *testing.T) {
				t.Parallel()
				onTime(t, func() *env { return newClusterEnv(t, s) }, test)
			})
		})
	}
}

// onFake runs test under s on miniredis and in process, on fake time.
func onFake(t *testing.T, s Strategy, test func(t *testing.T, e *env)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { test(t, newMiniEnv(t, s)) })
	})
	t.Run("local", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) { test(t, newLocalEnv(s)) })
	})
}

// newMiniEnv returns an env for strategy s on a miniredis in the current
// synctest bubble. The server refuses script commands and the test fails if
// any is sent, or if the Bucket's client sends a command not listed for s.
func newMiniEnv(t *testing.T, s Strategy) *env {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	// The server exists from the first Dial on.
	if c, err := m.Dial(); err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
	var scripts atomic.Int64
	m.Server().SetPreHook(func(c *server.Peer, cmd string, _ ...string) bool {
		for _, s := range scriptCommands {
			if strings.EqualFold(cmd, s) {
				scripts.Add(1)
				c.WriteError("NOPERM this user has no permissions to run the '" + strings.ToLower(cmd) + "' command")
				return true
			}
		}
		return false
	})
	client := func() *redis.Client { return miniClient(m) }
	e := &env{strategy: s, rdb: client(), admin: client(), prefix: "t", clock: newModelClock(), trips: &roundTrips{}, sent: &commandLog{}, mini: m}
	e.rdb.AddHook(e.sent)
	e.rdb.AddHook(e.trips)
	t.Cleanup(func() {
		e.rdb.Close()
		e.admin.Close()
		m.Close()
		if n := scripts.Load(); n > 0 {
			t.Errorf("%d script commands were sent", n)
		}
		e.checkSent(t, false)
	})
	return e
}

// miniClient returns a client of m, in the current synctest bubble.
func miniClient(m *miniredis.Miniredis) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: "miniredis",
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			c, err := m.Dial()
			if err != nil {
				return nil, err
			}
			return newQueuedConn(c), nil
		},
		// Fake time runs while a write to the pipe waits for
		// miniredis to read it: contexts bound the calls instead.
		ReadTimeout: -2, WriteTimeout: -2,
		// Its endpoint detection would resolve the address with DNS,
		// which cannot run inside a synctest bubble.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// checkSent fails the test if the Bucket's client sent a command that
// commands_test.go does not list for the env's strategy.
func (e *env) checkSent(t *testing.T, cluster bool) {
	t.Helper()
	if bad := e.sent.unexpected(strategyName(e.strategy), cluster); len(bad) > 0 {
		t.Errorf("strategy %v sent %q, which commands_test.go does not list for it", e.strategy, bad)
	}
}

// newRealEnv returns an env for strategy s on the real Redis, with a prefix
// of its own whose keys are deleted afterwards. Its Bucket's client is the
// ACL user of s.
func newRealEnv(t *testing.T, s Strategy) *env {
	t.Helper()
	rdb := realClient(t, s)
	admin := realAdmin(t)
	e := &env{strategy: s, rdb: rdb, admin: admin, prefix: uniquePrefix(t), real: true, clock: newModelClock(), trips: &roundTrips{}, sent: &commandLog{}}
	rdb.AddHook(e.sent)
	rdb.AddHook(e.trips)
	t.Cleanup(func() {
		cleanPrefix(admin, e.prefix)
		rdb.Close()
		e.checkSent(t, false)
	})
	return e
}

// newClusterEnv returns an env for strategy s on the real cluster, with a
// prefix of its own whose keys are deleted afterwards. Its Bucket's client
// is the ACL user of s.
func newClusterEnv(t *testing.T, s Strategy) *env {
	t.Helper()
	sent := &commandLog{}
	cc := clusterClient(t, s, sent)
	admin := clusterAdmin(t)
	e := &env{strategy: s, rdb: cc, admin: admin, prefix: uniquePrefix(t), real: true, clock: newModelClock(), trips: &roundTrips{}, sent: sent}
	e.addHook(e.trips)
	t.Cleanup(func() {
		cleanPrefix(admin, e.prefix)
		e.checkSent(t, true)
	})
	return e
}

// realDB is the database of the tests on the real Redis. It is not 0, so
// that go-redis sends SELECT, as for users who give the limiter a database
// of its own: the ACL users prove that +select is enough.
const realDB = 1

func realAddr() string { return os.Getenv(redisAddrVar) }

// realAddrOrSkip returns the real Redis's address, or skips the test (fails
// it under CI).
func realAddrOrSkip(t *testing.T) string {
	t.Helper()
	addr := realAddr()
	if addr == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the real-Redis suite (use make test)", redisAddrVar)
		}
		t.Skipf("%s is not set; `make test` starts a scripting-denied Redis", redisAddrVar)
	}
	return addr
}

// realClient connects to the real Redis as the ACL user of strategy s, or
// skips (fails under CI).
func realClient(t *testing.T, s Strategy) *redis.Client {
	t.Helper()
	return redis.NewClient(libraryOptions(realAddrOrSkip(t), strategyName(s), 128))
}

// realAdmin connects to the real Redis as the default user, or skips (fails
// under CI); it is closed when the test ends.
func realAdmin(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: realAddrOrSkip(t), DB: realDB, PoolSize: 128})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func uniquePrefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", ".", "{", "(", "}", ")").Replace(t.Name())
	return "lbtest:" + name + ":" + hex.EncodeToString(b[:])
}

// roundTrips counts what the client sends in one write: a command or a
// pipeline (a MULTI/EXEC included). The handshake of a new pooled connection
// (HELLO, SELECT, CLIENT SETINFO: connCommands) is not a decision's cost and
// is not counted.
// roundTrips counts round trips. A transaction that only scores again
// the members of a SortedSet decision that ran in another millisecond
// than expected (a loaded host, see rescored), or only moves a Windows decision's calls to the later
// interval it ran in (the same), is counted apart, in late: it comes with
// the machine's load, not with the call, and would make exact counts
// flaky.
//
// A move of a client's weight is guarded (see txn.Guard): it reads the
// client's hash under WATCH, then sends the transaction that moves the
// weight. The read is counted apart too, once the transaction after it
// shows it was a move's: the tests that count round trips make one call
// at a time.
type roundTrips struct {
	n, late  atomic.Int64
	watching atomic.Bool // the last pipeline read hashes under WATCH
}

func handshake(cmd redis.Cmder) bool { return isConnCommand(commandName(cmd)) }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			r.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		watched := r.watching.Swap(len(cmds) > 0 && commandName(cmds[0]) == "watch")
		switch {
		case len(cmds) == 0 || handshake(cmds[0]):
		case restampOnly(cmds) || moveOnly(cmds):
			r.late.Add(1)
			if watched {
				r.n.Add(-1)
				r.late.Add(1)
			}
		default:
			r.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// restampOnly reports whether a pipeline is a transaction that only
// scores members again (ZADD XX GT, with the TIME it ran at, or XX LT),
// and the WAIT for its replicas (WithReplicas).
func restampOnly(cmds []redis.Cmder) bool {
	restamps := 0
	for _, c := range cmds {
		args := c.Args()
		switch {
		case commandName(c) == "multi" || commandName(c) == "exec" || commandName(c) == "time" || commandName(c) == "wait":
		case commandName(c) == "zadd" && len(args) > 3 && fmt.Sprint(args[2]) == "xx" && (fmt.Sprint(args[3]) == "gt" || fmt.Sprint(args[3]) == "lt"):
			restamps++
		default:
			return false
		}
	}
	return restamps > 0
}

// moveOnly reports whether a pipeline is a transaction that only moves
// weight between intervals: HINCRBYs that add up to nothing, with the
// expiry (PEXPIREAT) and incarnation (HSETNX) of the keys they touch, its
// marker's SET (and PEXPIREAT), the TIME it ran at, the WAIT for its
// replicas, and the HDEL of the pending field a resend of it would write
// (txn.Txn.Resend). A take-back's add up to less, a decision's to more.
func moveOnly(cmds []redis.Cmder) bool {
	moves, sum := 0, int64(0)
	for _, c := range cmds {
		args := c.Args()
		switch commandName(c) {
		case "multi", "exec", "set", "pexpireat", "hsetnx", "hdel", "time", "wait":
		case "hincrby":
			n, err := strconv.ParseInt(fmt.Sprint(args[len(args)-1]), 10, 64)
			if err != nil {
				return false
			}
			moves, sum = moves+1, sum+n
		default:
			return false
		}
	}
	return moves > 0 && sum == 0
}

// count returns the round trips made by f.
func (r *roundTrips) count(f func()) int64 {
	before := r.n.Load()
	f()
	return r.n.Load() - before
}

// TestMain proves, on the real Redis, that its user cannot run scripts
// before the tests and that no script command reached it after them. Around
// the tests it creates and deletes the ACL users of acl_test.go, on the real
// Redis and the real cluster, and fails if a command was refused to them.
func TestMain(m *testing.M) {
	if spec := os.Getenv(helperVar); spec != "" {
		os.Exit(helperMain(spec))
	}
	if spec := os.Getenv(contentionVar); spec != "" {
		os.Exit(contentionMain(spec)) // contention_test.go
	}
	if spec := os.Getenv(gcraExactVar); spec != "" {
		os.Exit(gcraMain(spec)) // gcra_exact_test.go
	}
	if spec := os.Getenv(refundRaceVar); spec != "" {
		os.Exit(refundRaceMain(spec)) // refund_race_test.go
	}
	ctx := context.Background()
	teardown, err := testACLSetup(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "leakybucket tests:", errors.Join(err, teardown()))
		os.Exit(1)
	}
	addr := os.Getenv(redisAddrVar)
	if addr == "" {
		code := m.Run()
		if err := teardown(); err != nil {
			fmt.Fprintln(os.Stderr, "leakybucket tests:", err)
			code = 1
		}
		os.Exit(code)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := scriptingDenied(rdb); err != nil {
		fmt.Fprintln(os.Stderr, "leakybucket tests:", errors.Join(err, teardown()))
		os.Exit(1)
	}
	code := m.Run()
	if err := noScriptCalls(rdb); err != nil {
		fmt.Fprintln(os.Stderr, "leakybucket tests:", err)
		code = 1
	}
	if err := teardown(); err != nil {
		fmt.Fprintln(os.Stderr, "leakybucket tests:", err)
		code = 1
	}
	rdb.Close()
	os.Exit(code)
}

// scriptingDenied asks the server, without running anything, whether the
// current user may EVAL.
func scriptingDenied(rdb *redis.Client) error {
	ctx := context.Background()
	user, err := rdb.Do(ctx, "acl", "whoami").Text()
	if err != nil {
		return fmt.Errorf("ACL WHOAMI: %w", err)
	}
	verdict, err := rdb.Do(ctx, "acl", "dryrun", user, "eval", "return 1", "0").Text()
	if err != nil {
		return fmt.Errorf("ACL DRYRUN: %w", err)
	}
	if verdict == "OK" {
		return fmt.Errorf("the Redis at %s lets user %q run scripts: start it with -@scripting", rdb.Options().Addr, user)
	}
	return nil
}

// noScriptCalls fails if INFO commandstats shows any script command,
// called or refused.
func noScriptCalls(rdb *redis.Client) error {
	stats, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return fmt.Errorf("INFO commandstats: %w", err)
	}
	for line := range strings.SplitSeq(stats, "\n") {
		for _, s := range scriptCommands {
			if strings.HasPrefix(line, "cmdstat_"+s+":") || strings.HasPrefix(line, "cmdstat_"+s+"|") {
				return fmt.Errorf("a script command reached Redis: %s", strings.TrimSpace(line))
			}
		}
	}
	return nil
}

// queuedConn is a net.Pipe whose writes never wait for the other side to
// read: they queue, and a goroutine writes them in order. On a bare pipe a
// long pipeline deadlocks: miniredis blocks writing the replies of its
// first commands, which the client reads only once it has written the
// last.
type queuedConn struct {
	net.Conn
	mu     sync.Mutex
	queue  chan []byte
	closed bool
}

func newQueuedConn(c net.Conn) *queuedConn {
	q := &queuedConn{Conn: c, queue: make(chan []byte, 1<<16)}
	go func() {
		for b := range q.queue {
			if _, err := c.Write(b); err != nil {
				c.Close()
			}
		}
	}()
	return q
}

func (q *queuedConn) Write(b []byte) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, net.ErrClosed
	}
	q.queue <- slices.Clone(b)
	return len(b), nil
}

func (q *queuedConn) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.queue)
	}
	return q.Conn.Close()
}

// remoteOf is the backend of a Bucket made by New.
func remoteOf(b *Bucket) *remote { return b.counts.(*remote) }

// localOf is the backend of a Bucket made by NewLocal.
func localOf(b *Bucket) *localCounts { return b.counts.(*localCounts) }

// models returns rules as the counts judge them.
func models(rules []Rule) []limits.Rule { return newPlan(config{rules: rules}).Rules }

// watchScheduler sleeps 1 ms again and again until stop closes, and tells
// late how late each sleep woke: what a loaded machine's scheduler costs a
// waiting goroutine, which no library can help.
func watchScheduler(stop <-chan struct{}, late func(time.Duration)) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		start := time.Now()
		time.Sleep(time.Millisecond)
		late(time.Since(start) - time.Millisecond)
	}
}
