//go:build linux

package leakybucket

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/leakybucket/leakybucket/internal/acl"
	"github.com/leakybucket/leakybucket/internal/keys"
)

// Counts across a failover, on servers the tests start themselves: a
// primary with a replica under Sentinel, and a 3-master cluster with a
// replica per master. Twenty clients of Per(50, time.Minute) call steadily
// through the whole run, a few seconds, all inside one window; the
// replica falls behind, and is promoted while it is behind; each client
// goes on until the new primary denies it (it reached its limit there). Under each strategy, a Bucket WithReplicas admits at most 50 per
// client across the failover, and one without admits more: the counts of
// the lag are lost.
//
// The lag is a TCP proxy between the replica and its primary that delays
// every byte by two seconds, each way, from a moment on (the replica is
// promoted 1.6 s later, so that what the clients were admitted in that
// time is lost whatever the machine's load): a slow or congested link, as between zones, where the
// replica keeps applying and acknowledging in order, only late. A
// SIGSTOPped replica does not model the loss here: on loopback the kernel
// buffers the stream, and a replica resumed to be promoted reads it
// first. The promotion cuts the link, and with it whatever the proxy still
// held: the writes of the lag are lost, as when the primary dies.

const (
	failoverClients = 20
	failoverLimit   = 50
	failoverPace    = 80 * time.Millisecond // each client's calls: 12.5 a second, its limit in 4 s
	failoverInSync  = 800 * time.Millisecond
	failoverLagging = 1600 * time.Millisecond // behind, before the promotion
	// The run ends once every client was denied after the promotion, or
	// failoverAfter after it, and in any case failoverWithin after the
	// first call: every call falls in one window of every client.
	failoverAfter    = 40 * time.Second
	failoverWithin   = 55 * time.Second
	failoverLag      = 2 * time.Second
	failoverWait     = 100 * time.Millisecond // WithReplicas' timeout
	failoverDeadline = time.Second
	failoverPassword = "failover-password"
)

// failoverStrategies are the strategies of the failover tests.
var failoverStrategies = []Strategy{Logs, SortedSet, Windows(50 * time.Millisecond)}

// replicationArgs make full syncs start at once (Redis waits 5 s for more
// replicas by default).
var replicationArgs = []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}

// deployment is a replicated Redis under test.
type deployment struct {
	nodes    []*redis.Client // every data node, as the default user
	lag      *proxy          // the link of the replica that is promoted
	resource string          // a resource whose keys live on the primary that fails over
	cluster  bool
	// client returns a Bucket's client, as user, on logical database db
	// where there are several (not on a cluster), closed when the test
	// ends.
	client func(t *testing.T, user string, db int) redis.UniversalClient
	// promote promotes the lagging replica, calls named once the clients
	// may follow it, and returns once it has a replica of its own (the
	// old primary).
	promote func(t *testing.T, named func())
}

// TestFailoverSentinel: a primary, a replica and a Sentinel; the Buckets
// use go-redis's failover client, which follows the promotion.
func TestFailoverSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers and a Sentinel, for seconds")
	}
	failoverScenario(t, sentinelDeployment(t))
}

// TestFailoverCluster: a 3-master cluster with a replica per master; the
// replica of the master that holds the keys is promoted with CLUSTER
// FAILOVER TAKEOVER while it lags (a manual failover without TAKEOVER or
// FORCE waits for the replica to catch up, and loses nothing).
func TestFailoverCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 6-node cluster, for seconds")
	}
	failoverScenario(t, clusterDeployment(t))
}

// arm is one Bucket of the scenario and what it admitted.
type arm struct {
	strategy Strategy
	replicas bool
	b        *Bucket
	admitted [failoverClients]atomic.Int64
	byPhase  [phasesOfFailover]atomic.Int64 // admitted, by phase
	full     [failoverClients]atomic.Bool   // denied after the promotion
	errs     sync.Map                       // error text (first line) -> *atomic.Int64
}

func (a *arm) String() string {
	if a.replicas {
		return a.strategy.String() + " WithReplicas"
	}
	return a.strategy.String()
}

func failoverScenario(t *testing.T, d deployment) {
	for _, s := range acl.Names {
		cmds := append(acl.OfStrategy(s, d.cluster), acl.Grants(d.cluster)...)
		cmds = append(cmds, acl.Replicas...)
		for _, node := range d.nodes {
			setFailoverUser(t, node, "lbfail-"+s, cmds)
		}
	}
	var arms []*arm
	for _, s := range failoverStrategies {
		for _, replicas := range []bool{true, false} {
			a := &arm{strategy: s, replicas: replicas}
			// Logs walks the database with SCAN at every decision, and its
			// logs fill it: one page, and where the server has logical
			// databases, one for each Bucket, keep Redis from being the
			// bottleneck of the run on a loaded machine.
			opts := []Option{WithStrategy(s), WithPrefix(fmt.Sprintf("fo%d", len(arms))), PerClient(Per(failoverLimit, time.Minute)),
				WithScanCount(1 << 20)}
			if replicas {
				opts = append(opts, WithReplicas(1, failoverWait))
			}
			var err error
			if a.b, err = New(d.client(t, "lbfail-"+strategyName(s), len(arms)+1), opts...); err != nil {
				t.Fatal(err)
			}
			arms = append(arms, a)
		}
	}
	stop := make(chan struct{})
	var phase atomic.Int32
	var wg sync.WaitGroup
	first := time.Now()
	for _, a := range arms {
		for c := range failoverClients {
			wg.Go(func() { a.call(d.resource, c, stop, &phase) })
		}
	}
	time.Sleep(failoverInSync)
	d.lag.SetLatency(failoverLag)
	phase.Store(lagging)
	time.Sleep(failoverLagging)
	start := time.Now()
	d.promote(t, func() {
		phase.Store(promoted)
		t.Logf("promoted in %v", time.Since(start).Round(time.Millisecond))
	})
	t.Logf("the old primary replicates the new one %v after the promotion began", time.Since(start).Round(time.Millisecond))
	full := func() bool {
		for _, a := range arms {
			if !a.allFull() {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(failoverAfter)
	if last := first.Add(failoverWithin); last.Before(deadline) {
		deadline = last
	}
	for !full() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("every client reached its limit %v after the promotion began: %v", time.Since(start).Round(time.Millisecond), full())
	close(stop)
	wg.Wait()
	for _, a := range arms {
		a.check(t, full())
	}
	for _, node := range d.nodes {
		if err := refusedTo(node, "lbfail-"); err != nil {
			t.Error(err)
		}
	}
}

// Phases of a failover scenario: when a call starts.
const (
	inSync = iota
	lagging
	promoted // the clients may follow the new primary
	phasesOfFailover
)

// call makes client c's calls, one per failoverPace, until the new
// primary denies one, or stop.
func (a *arm) call(resource string, c int, stop <-chan struct{}, phase *atomic.Int32) {
	client := "c" + strconv.Itoa(c)
	tick := time.NewTicker(failoverPace)
	defer tick.Stop()
	for !a.full[c].Load() {
		at := phase.Load()
		after := at == promoted
		ctx, cancel := context.WithTimeout(context.Background(), failoverDeadline)
		res, err := a.b.Allow(ctx, resource, client)
		cancel()
		switch {
		case err != nil:
			text, _, _ := strings.Cut(err.Error(), "\n")
			if len(text) > 120 {
				text = text[:120]
			}
			n, _ := a.errs.LoadOrStore(text, &atomic.Int64{})
			n.(*atomic.Int64).Add(1)
		case res.Allowed:
			a.admitted[c].Add(1)
			a.byPhase[at].Add(1)
		case after:
			a.full[c].Store(true)
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// check: WithReplicas, no client past its limit, and calls admitted after
// the promotion (the new primary admits again; a client may be denied
// there with fewer than 50 admitted, as the take-backs of the decisions
// whose acknowledgement was on its way when the lag began ran on the old
// primary only, while their writes reached the replica: counted in error,
// which errs on the side of denying); without, more than the limit
// admitted in all, once every client reached its limit again (full).
func (a *arm) check(t *testing.T, full bool) {
	t.Helper()
	total, worst := int64(0), int64(0)
	for c := range a.admitted {
		n := a.admitted[c].Load()
		total += n
		worst = max(worst, n)
	}
	var errs []string
	a.errs.Range(func(k, v any) bool {
		errs = append(errs, fmt.Sprintf("%d× %s", v.(*atomic.Int64).Load(), k))
		return true
	})
	slices.Sort(errs)
	t.Logf("%v: %d admitted (%d in sync, %d while the replica lagged, %d after the promotion), at most %d for one client, of %d allowed; errors: %q",
		a, total, a.byPhase[inSync].Load(), a.byPhase[lagging].Load(), a.byPhase[promoted].Load(), worst, failoverClients*failoverLimit, errs)
	switch {
	case a.replicas && worst > failoverLimit:
		t.Errorf("%v: a client was admitted %d times in its window, over its limit of %d", a, worst, failoverLimit)
	case a.replicas && a.byPhase[promoted].Load() == 0:
		t.Errorf("%v: nothing admitted after the promotion", a)
	case !a.replicas && total <= failoverClients*failoverLimit:
		t.Errorf("%v: %d admitted, not over the %d allowed: the failover lost no count, or (every client back at its limit: %v) the run ended first, and the test proves nothing",
			a, total, failoverClients*failoverLimit, full)
	}
}

// allFull reports whether every client was denied after the promotion.
func (a *arm) allFull() bool {
	for c := range a.full {
		if !a.full[c].Load() {
			return false
		}
	}
	return true
}

// setFailoverUser creates user on node, allowed only those of cmds the
// server knows (Redis 7.0 has no CLIENT SETINFO), on every key.
func setFailoverUser(t *testing.T, node *redis.Client, user string, cmds []string) {
	t.Helper()
	ctx := context.Background()
	var known []string
	for _, c := range cmds {
		ok, err := acl.Known(ctx, node, c)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			known = append(known, c)
		}
	}
	args := []any{"acl", "setuser", user, "reset", "on", ">" + failoverPassword, "~*", "resetchannels"}
	for _, r := range aclRules(acl.Unique(known)) {
		args = append(args, r)
	}
	if err := node.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("%s: ACL SETUSER %s: %v", node.Options().Addr, user, err)
	}
}

// refusedTo returns an error listing what the ACL LOG of node holds
// against the users whose names start with prefix.
func refusedTo(node *redis.Client, prefix string) error {
	entries, err := node.ACLLog(context.Background(), 1000).Result()
	if err != nil {
		return fmt.Errorf("%s: ACL LOG: %w", node.Options().Addr, err)
	}
	var refused []string
	for _, e := range entries {
		if strings.HasPrefix(e.Username, prefix) {
			refused = append(refused, fmt.Sprintf("%s: %s %q (%s)", e.Username, e.Reason, e.Object, e.Context))
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("%s refused: %s", node.Options().Addr, strings.Join(refused, "; "))
	}
	return nil
}

// adminOf returns a client of p as the default user, closed when the test
// ends.
func adminOf(t *testing.T, p *redisProc) *redis.Client {
	t.Helper()
	return faultClient(t, redis.Options{Addr: p.Addr(), MaxRetries: -1})
}

// infoField returns field of INFO section on node, "" if it cannot.
func infoField(node *redis.Client, section, field string) string {
	text, err := node.Info(context.Background(), section).Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// waitFor polls cond until it holds, or fails the test after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitReplicated waits until primary has a replica online that has
// acknowledged every write made before the wait: right after a full sync
// a replica shows online while it still loads what it was sent, and WAIT
// gets no acknowledgement from it yet.
func waitReplicated(t *testing.T, primary, replica *redis.Client) {
	t.Helper()
	what := replica.Options().Addr + " replicating " + primary.Options().Addr
	waitFor(t, 20*time.Second, what, func() bool {
		return infoField(replica, "replication", "master_link_status") == "up" &&
			strings.Contains(infoField(primary, "replication", "slave0"), "state=online")
	})
	written, _ := strconv.ParseInt(infoField(primary, "replication", "master_repl_offset"), 10, 64)
	waitFor(t, 20*time.Second, what+", acknowledged", func() bool {
		for kv := range strings.SplitSeq(infoField(primary, "replication", "slave0"), ",") {
			if v, ok := strings.CutPrefix(kv, "offset="); ok {
				acked, _ := strconv.ParseInt(v, 10, 64)
				return acked >= written
			}
		}
		return false
	})
}

func hostPort(t *testing.T, addr string) (string, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return host, port
}

// sentinelDeployment starts a primary, a replica that reaches it through
// the lag proxy, and a Sentinel monitoring them (quorum 1). Its promotion
// is SENTINEL FAILOVER; the old primary, which Sentinel would make a
// replica of the new one 8 s later, is made one at once.
func sentinelDeployment(t *testing.T) deployment {
	primary := startRedisWith(t, replicationArgs...)
	lag := startProxy(t, primary.Addr())
	host, port := hostPort(t, lag.Addr())
	replica := startRedisWith(t, append([]string{"--replicaof", host, port}, replicationArgs...)...)
	p, r := adminOf(t, primary), adminOf(t, replica)
	waitReplicated(t, p, r)
	sentinel := startSentinel(t, primary.Addr())
	sc := redis.NewSentinelClient(&redis.Options{Addr: sentinel, MaxRetries: -1})
	t.Cleanup(func() { _ = sc.Close() })
	waitFor(t, 20*time.Second, "Sentinel sees the replica", func() bool {
		replicas, err := sc.Replicas(context.Background(), "m").Result()
		return err == nil && len(replicas) == 1 && replicas[0]["flags"] == "slave" && replicas[0]["master-link-status"] == "ok"
	})
	return deployment{
		nodes: []*redis.Client{p, r}, lag: lag, resource: "r",
		client: func(t *testing.T, user string, db int) redis.UniversalClient {
			rdb := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: "m", SentinelAddrs: []string{sentinel}, DB: db,
				Username: user, Password: failoverPassword, ContextTimeoutEnabled: true,
			})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		},
		promote: func(t *testing.T, named func()) {
			ctx := context.Background()
			t.Logf("replica's master: %s:%s", infoField(r, "replication", "master_host"), infoField(r, "replication", "master_port"))
			waitFor(t, 10*time.Second, "SENTINEL FAILOVER", func() bool { return sc.Failover(ctx, "m").Err() == nil })
			t.Logf("SENTINEL FAILOVER accepted")
			waitFor(t, 30*time.Second, "Sentinel names the new primary", func() bool {
				addr, err := sc.GetMasterAddrByName(ctx, "m").Result()
				return err == nil && net.JoinHostPort(addr[0], addr[1]) == replica.Addr()
			})
			named()
			host, port := hostPort(t, replica.Addr())
			if err := p.ReplicaOf(ctx, host, port).Err(); err != nil {
				t.Fatal(err)
			}
			waitReplicated(t, r, p)
		},
	}
}

// startSentinel starts a Sentinel (redis-sentinel, Debian's package of
// it, which scripts/test.sh installs) on a free loopback port, monitoring
// the primary at addr as "m" with a quorum of 1, and returns its address.
// It is killed when the test ends.
func startSentinel(t *testing.T, primary string) string {
	t.Helper()
	bin := binOrSkip(t, "redis-sentinel")
	host, port := hostPort(t, primary)
	for range 3 {
		dir := t.TempDir()
		sport := freePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
			"sentinel monitor m %s %s 1\nsentinel down-after-milliseconds m 60000\nsentinel failover-timeout m 60000\n",
			sport, dir, filepath.Join(dir, "sentinel.log"), host, port)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, conf)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				log, _ := os.ReadFile(filepath.Join(dir, "sentinel.log"))
				t.Logf("Sentinel's log:\n%s", log)
			}
		})
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sport))
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			info, err := rawCommand(addr, "INFO server", 200*time.Millisecond)
			if err == nil && strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n") {
				return addr
			}
		}
	}
	t.Fatal("redis-sentinel would not start on 3 ports in a row")
	return ""
}

// clusterDeployment starts a 3-master cluster with a replica per master,
// the first master's reaching it through the lag proxy: that master
// announces the proxy's port, and the Buckets' clients dial the master
// itself for it. Its promotion is CLUSTER FAILOVER TAKEOVER on that
// replica; the old master then becomes a replica of it by itself.
func clusterDeployment(t *testing.T) deployment {
	ctx := context.Background()
	procs := make([]*redisProc, 6)
	buses := make([]int, 6)
	nodes := make([]*redis.Client, 6)
	for i := range procs {
		buses[i] = freePort(t)
		procs[i] = startRedisWith(t, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(buses[i]), "--cluster-node-timeout", "5000",
			"--cluster-require-full-coverage", "no"}, replicationArgs...)...)
		nodes[i] = adminOf(t, procs[i])
	}
	lag := startProxy(t, procs[0].Addr())
	_, lagPort := hostPort(t, lag.Addr())
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(nodes[0].ConfigSet(ctx, "cluster-announce-port", lagPort).Err())
	for i, r := range [][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}} {
		must(nodes[i].Do(ctx, "cluster", "addslotsrange", r[0], r[1]).Err())
	}
	for i := 1; i < len(procs); i++ {
		must(nodes[0].Do(ctx, "cluster", "meet", "127.0.0.1", procs[i].port, buses[i]).Err())
	}
	waitFor(t, 20*time.Second, "the nodes meet", func() bool {
		for _, n := range nodes {
			text, err := n.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(strings.TrimSpace(text), "\n") != 5 || strings.Contains(text, "handshake") {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		id, err := nodes[i].Do(ctx, "cluster", "myid").Text()
		must(err)
		must(nodes[3+i].Do(ctx, "cluster", "replicate", id).Err())
	}
	for i := range 3 {
		waitReplicated(t, nodes[i], nodes[3+i])
	}
	waitFor(t, 20*time.Second, "cluster_state:ok", func() bool {
		for _, n := range nodes {
			if infoField(n, "cluster", "cluster_enabled") != "1" {
				return false
			}
			if text, err := n.ClusterInfo(ctx).Result(); err != nil || !strings.Contains(text, "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return deployment{
		nodes: nodes, lag: lag, resource: resourceIn(t, nodes[0], 0, 5460), cluster: true,
		client: func(t *testing.T, user string, _ int) redis.UniversalClient {
			direct := &net.Dialer{Timeout: 5 * time.Second}
			cc := redis.NewClusterClient(&redis.ClusterOptions{
				Addrs: []string{procs[1].Addr()}, Username: user, Password: failoverPassword, ContextTimeoutEnabled: true,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					if addr == lag.Addr() {
						addr = procs[0].Addr() // the Buckets reach the master directly; its replica lags
					}
					return direct.DialContext(ctx, network, addr)
				},
				MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
			})
			t.Cleanup(func() { _ = cc.Close() })
			return cc
		},
		promote: func(t *testing.T, named func()) {
			must(nodes[3].Do(ctx, "cluster", "failover", "takeover").Err())
			waitFor(t, 20*time.Second, "the replica takes over", func() bool {
				return infoField(nodes[3], "replication", "role") == "master"
			})
			named()
			waitFor(t, 20*time.Second, "the old master follows the new one", func() bool {
				return infoField(nodes[0], "replication", "role") == "slave"
			})
			waitReplicated(t, nodes[3], nodes[0])
		},
	}
}

// resourceIn returns a resource whose keys' slot is in [from, to].
func resourceIn(t *testing.T, node *redis.Client, from, to int64) string {
	t.Helper()
	for i := range 1000 {
		r := "r" + strconv.Itoa(i)
		slot, err := node.ClusterKeySlot(context.Background(), keys.Of("x", r).Slot()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if slot >= from && slot <= to {
			return r
		}
	}
	t.Fatalf("no resource in slots %d-%d", from, to)
	return ""
}

// TestReplicaStops: WithReplicas, a replica that stops acknowledging
// (SIGSTOP) makes every call fail as unavailable, with ErrNotReplicated,
// within its deadline, even where the wait asked for is longer than the
// deadline, or, WithFallback, be decided by the fallback, with no error,
// within its deadline; nothing the calls wrote stays counted once they returned and
// their take-backs ran (the keys are read); the breaker stays closed; and
// the calls are admitted again once the replica resumes. Before, with the
// replica in sync, an uncontended decision costs the round trips it costs
// without the option: one under SortedSet and Windows, two under Logs.
func TestReplicaStops(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers")
	}
	primary := startRedisWith(t, replicationArgs...)
	host, port := hostPort(t, primary.Addr())
	replica := startRedisWith(t, append([]string{"--replicaof", host, port}, replicationArgs...)...)
	p := adminOf(t, primary)
	waitReplicated(t, p, adminOf(t, replica))
	for _, s := range failoverStrategies {
		t.Run(s.String(), func(t *testing.T) {
			name := strategyName(s)
			cmds := append(acl.OfStrategy(name, false), acl.Grants(false)...)
			setFailoverUser(t, p, "lbstop-"+name, append(cmds, acl.Replicas...))
			rdb := faultClient(t, redis.Options{Addr: primary.Addr(), Username: "lbstop-" + name, Password: failoverPassword})
			trips := &roundTrips{}
			rdb.AddHook(trips)
			prefix := "stop" + name
			rules := []Option{WithStrategy(s), PerClient(Per(5, time.Minute)), PerResource(Per(1000, time.Minute))}
			// A wait far longer than an acknowledgement takes, even on a
			// loaded machine: these decisions must be admitted.
			checkReplicaTrips(t, faultBucket(t, rdb, append(rules, WithPrefix("trips"+name), WithReplicas(1, 2*time.Second))...), trips, s)
			b := faultBucket(t, rdb, append(rules, WithPrefix(prefix), WithReplicas(1, 50*time.Millisecond))...)
			replica.Stop()
			stopped := true
			defer func() {
				if stopped {
					replica.Cont()
				}
			}()
			checkReplicaStopped(t, b, 500*time.Millisecond)
			slow := faultBucket(t, rdb, append(rules, WithPrefix(prefix), WithReplicas(1, 5*time.Second))...)
			checkReplicaStopped(t, slow, time.Second)
			if w := waitUncounted(t, p, prefix); w != 0 {
				t.Errorf("the keys still count %d units: %q", w, keysUnder(t, p, prefix))
			}
			fb := faultBucket(t, rdb, append(rules, WithPrefix("fb"+prefix), WithReplicas(1, 50*time.Millisecond), WithFallback(1))...)
			checkReplicaFallback(t, fb, 500*time.Millisecond)
			if w := waitUncounted(t, p, "fb"+prefix); w != 0 {
				t.Errorf("WithFallback: the keys still count %d units: %q", w, keysUnder(t, p, "fb"+prefix))
			}
			if res, err := b.Peek(context.Background(), "r", "c0"); err != nil || res.Rules[0].Remaining != 4 {
				t.Errorf("Peek = %+v, %v: want nothing counted, and the breaker closed", res, err)
			}
			replica.Cont()
			stopped = false
			took, ok, last := timeToAdmit(b, "r", "back", time.Now(), time.Second, 10*time.Second)
			if !ok {
				t.Errorf("not admitted within 10s of the replica's resuming: %v", last)
			}
			t.Logf("admitted %v after the replica resumed", took.Round(time.Millisecond))
			if err := refusedTo(p, "lbstop-"); err != nil {
				t.Error(err)
			}
		})
	}
}

// checkReplicaTrips: uncontended decisions, admitted, cost what they cost
// without WithReplicas.
func checkReplicaTrips(t *testing.T, b *Bucket, trips *roundTrips, s Strategy) {
	t.Helper()
	ctx := context.Background()
	if _, err := b.Peek(ctx, "r", "trips"); err != nil { // the first estimate of Redis's clock
		t.Fatal(err)
	}
	want := int64(1)
	if _, ok := s.(logsStrategy); ok {
		want = 2
	}
	for i := range 4 {
		var res Result
		var err error
		if n := trips.count(func() { res, err = b.Allow(ctx, "r", "trips"+strconv.Itoa(i)) }); n != want || err != nil || !res.Allowed {
			t.Errorf("an uncontended decision WithReplicas: %d round trips (%+v, %v), want %d", n, res, err, want)
		}
	}
}

// checkReplicaStopped: calls of several clients at once, each with
// deadline, all fail as unavailable and not replicated, in time.
func checkReplicaStopped(t *testing.T, b *Bucket, deadline time.Duration) {
	t.Helper()
	if bad := unreplicatedCalls(b, 10, deadline); len(bad) > 0 {
		t.Errorf("deadline %v: %d of 30 calls were not unavailable and not replicated in time; first: %s", deadline, len(bad), bad[0])
	}
}

// checkReplicaFallback: calls of several clients at once, each with
// deadline, all decided by the fallback (each client's three calls
// within its share), in time.
func checkReplicaFallback(t *testing.T, b *Bucket, deadline time.Duration) {
	t.Helper()
	bad := callsAtOnce(b, 10, deadline, func(res Result, err error) bool { return err == nil && res.Fallback && res.Allowed })
	if len(bad) > 0 {
		t.Errorf("WithFallback, deadline %v: %d of 30 calls were not admitted by the fallback in time; first: %s", deadline, len(bad), bad[0])
	}
}
