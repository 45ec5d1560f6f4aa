package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// The cluster suite runs on a real 3-master Redis Cluster whose default user
// is denied scripting, at $LEAKYBUCKET_CLUSTER_ADDRS (`make test` starts one
// with scripts/cluster.sh; $LEAKYBUCKET_CLUSTER_PIDS names the masters'
// processes, in the same order, for the node-stop test). Without the
// addresses the suite is skipped, except under CI, where it fails.
//
// Its tests are not parallel: they move slots and pause masters, and count
// the SCAN calls each master serves, so each has the cluster to itself (Go
// runs the parallel tests only after every sequential one). Each leaves the
// slot layout as it found it.

const (
	clusterAddrsVar = "LEAKYBUCKET_CLUSTER_ADDRS"
	clusterPidsVar  = "LEAKYBUCKET_CLUSTER_PIDS"
)

// clusterMaster is one master of the test cluster, reached directly rather
// than through a ClusterClient.
type clusterMaster struct {
	addr string
	id   string // CLUSTER MYID
	pid  int    // 0 if $LEAKYBUCKET_CLUSTER_PIDS is not set
	rdb  *redis.Client
}

type testCluster struct {
	masters []*clusterMaster // in the order of $LEAKYBUCKET_CLUSTER_ADDRS
	tune    []func(*redis.ClusterOptions)
}

var clusterChecked struct {
	once sync.Once
	err  error
}

// clusterAddrs returns the masters' addresses, or skips the test (fails it
// under CI).
func clusterAddrs(t *testing.T) []string {
	t.Helper()
	addrs := os.Getenv(clusterAddrsVar)
	if addrs == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the cluster suite (use make test)", clusterAddrsVar)
		}
		t.Skipf("%s is not set; `make test` starts a 3-master cluster", clusterAddrsVar)
	}
	return strings.Split(addrs, ",")
}

// clusterClient returns a ClusterClient on the test cluster for a Bucket of
// strategy s, as the ACL user of s (acl_test.go), or skips the test (fails
// it under CI). If log is not nil, it logs what every node's client sends.
// Before the first test it checks that every master denies scripting; after
// each test, that no script command reached any master. Contexts bound
// network I/O (ContextTimeoutEnabled), as the README tells users to set.
// tune, if given, changes the options first.
func clusterClient(t *testing.T, s Strategy, log *commandLog, tune ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	cc := newClusterClient(t, userOf(strategyName(s)), testUsers.password, tune...)
	if log != nil {
		cc.OnNewNode(func(node *redis.Client) { node.AddHook(log) })
	}
	return cc
}

// clusterAdmin returns a ClusterClient on the test cluster as the default
// user, for the tests' own commands, as clusterClient does.
func clusterAdmin(t *testing.T) *redis.ClusterClient {
	t.Helper()
	return newClusterClient(t, "", "")
}

func newClusterClient(t *testing.T, user, password string, tune ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	addrs := clusterAddrs(t)
	clusterChecked.once.Do(func() { clusterChecked.err = clusterScriptingDenied(addrs) })
	if clusterChecked.err != nil {
		t.Fatal(clusterChecked.err)
	}
	opts := &redis.ClusterOptions{Addrs: addrs, Username: user, Password: password, PoolSize: 64, ContextTimeoutEnabled: true}
	for _, f := range tune {
		f(opts)
	}
	cc := redis.NewClusterClient(opts)
	t.Cleanup(func() {
		cc.Close()
		for _, addr := range addrs {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			if err := noScriptCalls(rdb); err != nil {
				t.Errorf("%s: %v", addr, err)
			}
			rdb.Close()
		}
	})
	return cc
}

// clusterScriptingDenied checks every master with ACL DRYRUN.
func clusterScriptingDenied(addrs []string) error {
	for _, addr := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		err := scriptingDenied(rdb)
		rdb.Close()
		if err != nil {
			return fmt.Errorf("cluster master %s: %w", addr, err)
		}
	}
	return nil
}

// newTestCluster returns the masters, with a ClusterClient from
// clusterAdmin for the test's own commands; the Buckets of eachStrategy get
// clusterClient(t, s, log, tune...). It fails if the cluster is not 3
// masters in state ok.
func newTestCluster(t *testing.T, tune ...func(*redis.ClusterOptions)) (*testCluster, *redis.ClusterClient) {
	t.Helper()
	cc := clusterAdmin(t)
	addrs := clusterAddrs(t)
	var pids []string
	if s := os.Getenv(clusterPidsVar); s != "" {
		pids = strings.Split(s, ",")
	}
	ctx := context.Background()
	tc := &testCluster{tune: tune}
	for i, addr := range addrs {
		m := &clusterMaster{addr: addr, rdb: redis.NewClient(&redis.Options{Addr: addr})}
		t.Cleanup(func() { m.rdb.Close() })
		id, err := m.rdb.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("%s: CLUSTER MYID: %v", addr, err)
		}
		m.id = id
		if i < len(pids) {
			if m.pid, err = strconv.Atoi(pids[i]); err != nil {
				t.Fatalf("%s = %q: %v", clusterPidsVar, os.Getenv(clusterPidsVar), err)
			}
		}
		tc.masters = append(tc.masters, m)
	}
	if len(tc.masters) != 3 {
		t.Fatalf("%s names %d masters, want 3", clusterAddrsVar, len(tc.masters))
	}
	tc.waitConsistent(t)
	return tc, cc
}

// slot returns the cluster slot of key, as the server computes it.
func (tc *testCluster) slot(t *testing.T, key string) int {
	t.Helper()
	n, err := tc.masters[0].rdb.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %q: %v", key, err)
	}
	return int(n)
}

// owners returns which master owns each slot, as master m sees it.
func (tc *testCluster) owners(m *clusterMaster) ([16384]*clusterMaster, error) {
	var owners [16384]*clusterMaster
	ranges, err := m.rdb.ClusterSlots(context.Background()).Result()
	if err != nil {
		return owners, err
	}
	for _, r := range ranges {
		i := slices.IndexFunc(tc.masters, func(m *clusterMaster) bool { return len(r.Nodes) > 0 && m.id == r.Nodes[0].ID })
		if i < 0 {
			return owners, fmt.Errorf("slots %d-%d belong to an unknown node %+v", r.Start, r.End, r.Nodes)
		}
		for s := r.Start; s <= r.End; s++ {
			owners[s] = tc.masters[i]
		}
	}
	return owners, nil
}

// owner returns the master that owns slot.
func (tc *testCluster) owner(t *testing.T, slot int) *clusterMaster {
	t.Helper()
	owners, err := tc.owners(tc.masters[0])
	if err != nil || owners[slot] == nil {
		t.Fatalf("owner of slot %d: %v, %v", slot, owners[slot], err)
	}
	return owners[slot]
}

// waitConsistent waits until every master is in cluster_state:ok and all
// agree on who owns every slot. It gives up after 30s, far more than the
// cluster takes even on a loaded machine, which costs nothing when it is
// quicker.
func (tc *testCluster) waitConsistent(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var problem string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		problem = ""
		var first [16384]*clusterMaster
		for i, m := range tc.masters {
			info, err := m.rdb.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				problem = fmt.Sprintf("%s: not ok: %v", m.addr, err)
				break
			}
			owners, err := tc.owners(m)
			if err != nil {
				problem = fmt.Sprintf("%s: %v", m.addr, err)
				break
			}
			if i == 0 {
				first = owners
			} else if owners != first {
				problem = fmt.Sprintf("%s and %s disagree on the slots", tc.masters[0].addr, m.addr)
				break
			}
		}
		if problem == "" {
			return
		}
	}
	t.Fatalf("cluster not consistent after 30s: %s", problem)
}

// resourceOn returns the first resource among candidates whose slot is
// owned by m.
func (tc *testCluster) resourceOn(t *testing.T, m *clusterMaster, candidates func(i int) string) string {
	t.Helper()
	for i := range 10000 {
		r := candidates(i)
		if tc.owner(t, tc.slot(t, keys.Of("p", r).Slot())) == m {
			return r
		}
	}
	t.Fatalf("no resource on %s", m.addr)
	return ""
}

// keysOn returns the keys under prefix that master m holds.
func (m *clusterMaster) keysOn(t *testing.T, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var found []string
	iter := m.rdb.Scan(ctx, 0, keys.MatchPrefix(prefix), 1000).Iterator()
	for iter.Next(ctx) {
		found = append(found, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatalf("%s: SCAN: %v", m.addr, err)
	}
	return found
}

// cleanPrefix deletes every key under prefix on every master.
func (tc *testCluster) cleanPrefix(prefix string) {
	for _, m := range tc.masters {
		cleanPrefix(m.rdb, prefix)
	}
}

// eachStrategy runs test once per strategy, one after another, with a
// Bucket made with opts under a prefix of its own, whose keys are deleted
// afterwards, on a ClusterClient of the strategy's ACL user. The test fails
// if that client sent a command commands_test.go does not list.
func (tc *testCluster) eachStrategy(t *testing.T, opts []Option, test func(t *testing.T, s Strategy, b *Bucket, prefix string)) {
	t.Helper()
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			prefix := uniquePrefix(t)
			defer tc.cleanPrefix(prefix)
			log := &commandLog{}
			b, err := New(clusterClient(t, s, log, tc.tune...), append([]Option{WithStrategy(s), WithPrefix(prefix)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			test(t, s, b, prefix)
			if bad := log.unexpected(strategyName(s), true); len(bad) > 0 {
				t.Errorf("strategy %v sent %q, which commands_test.go does not list for it", s, bad)
			}
		})
	}
}

// awkward are resource and client strings with hash-tag, glob and key
// separator characters.
var awkward = []string{"*", "{x}", "}", ":", `\`}

// TestClusterSlots drives resources on each of the 3 masters, named with
// awkward strings, through Allow, Peek, Flush and FlushAll with a
// per-resource and a per-client rule: the counts are exact, no call ever
// fails (no CROSSSLOT), and every key a resource's decisions write lives in
// that resource's slot, on the master that owns it.
func TestClusterSlots(t *testing.T) {
	tc, cc := newTestCluster(t)
	ctx := context.Background()

	// The awkward strings themselves, then variants until every master has one.
	resources := slices.Clone(awkward)
	covered := map[*clusterMaster]bool{}
	slotOf := map[string]int{} // by encoded resource
	add := func(r string) {
		key := keys.Of("p", r).Slot()
		slot := tc.slot(t, key)
		owner := tc.owner(t, slot)
		node, err := cc.MasterForKey(ctx, key)
		if err != nil || node.Options().Addr != owner.addr {
			t.Fatalf("MasterForKey(%q) = %v, %v; CLUSTER SLOTS says %s", key, node, err, owner.addr)
		}
		covered[owner] = true
		slotOf[keys.Encode(r)] = slot
	}
	for _, r := range resources {
		add(r)
	}
	for i := 0; len(covered) < len(tc.masters); i++ {
		r := awkward[i%len(awkward)] + strconv.Itoa(i)
		if !covered[tc.owner(t, tc.slot(t, keys.Of("p", r).Slot()))] {
			resources = append(resources, r)
			add(r)
		}
	}

	rules := []Option{PerResource(Per(5, time.Minute)), PerClient(Per(2, time.Minute))}
	tc.eachStrategy(t, rules, func(t *testing.T, _ Strategy, b *Bucket, prefix string) {
		for _, r := range resources {
			m := newModel(5, 2)
			for _, c := range awkward {
				for range 3 {
					wantAllowed, wantRemaining := m.allow(c)
					res, err := b.Allow(ctx, r, c)
					if err != nil || res.Allowed != wantAllowed || res.Remaining != wantRemaining {
						t.Fatalf("Allow(%q, %q) = %+v, %v; want Allowed %v, Remaining %d", r, c, res, err, wantAllowed, wantRemaining)
					}
				}
			}
			if err := b.Flush(ctx, r, awkward[0]); err != nil {
				t.Fatalf("Flush(%q, %q): %v", r, awkward[0], err)
			}
			m.flush(awkward[0])
			for _, c := range awkward {
				wantAllowed, wantRemaining := m.peek(c)
				res, err := b.Peek(ctx, r, c)
				if err != nil || res.Allowed != wantAllowed || res.Remaining != wantRemaining {
					t.Fatalf("Peek(%q, %q) after Flush = %+v, %v; want Allowed %v, Remaining %d", r, c, res, err, wantAllowed, wantRemaining)
				}
			}
		}

		// Every key lives in its resource's slot, on the slot's owner.
		found := map[string]int{}
		for _, m := range tc.masters {
			for _, key := range m.keysOn(t, prefix) {
				_, tagged, _ := strings.Cut(strings.TrimPrefix(key, prefix), ":{")
				enc, _, _ := strings.Cut(tagged, "}")
				want, ok := slotOf[enc]
				if got := tc.slot(t, key); !ok || got != want {
					t.Errorf("key %q is in slot %d; its resource's slot is %d (known: %v)", key, got, want, ok)
				}
				if owner := tc.owner(t, want); owner != m {
					t.Errorf("key %q is on %s; its slot's owner is %s", key, m.addr, owner.addr)
				}
				found[enc]++
			}
		}
		for _, r := range resources {
			if found[keys.Encode(r)] == 0 {
				t.Errorf("no key of resource %q found", r)
			}
		}

		for _, r := range resources {
			if err := b.FlushAll(ctx, r); err != nil {
				t.Fatalf("FlushAll(%q): %v", r, err)
			}
			if res, err := b.Peek(ctx, r, awkward[1]); err != nil || !res.Allowed || res.Remaining != 1 {
				t.Errorf("Peek(%q) after FlushAll = %+v, %v; want admitted with 1 left", r, res, err)
			}
		}
		for _, m := range tc.masters {
			if keys := countsOnly(m.keysOn(t, prefix)); len(keys) > 0 {
				t.Errorf("%s still holds %d keys after FlushAll, as %q", m.addr, len(keys), keys[0])
			}
		}
	})
}

// model is what one resource's rules admit: a per-resource and a
// per-client limit, no window passing.
type model struct {
	resource, client int
	used             int
	byClient         map[string]int
}

func newModel(resource, client int) *model {
	return &model{resource: resource, client: client, byClient: map[string]int{}}
}

func (m *model) peek(c string) (bool, int) {
	ok := m.used < m.resource && m.byClient[c] < m.client
	if ok {
		return true, min(m.resource-m.used, m.client-m.byClient[c]) - 1
	}
	return false, max(0, min(m.resource-m.used, m.client-m.byClient[c]))
}

func (m *model) allow(c string) (bool, int) {
	ok, remaining := m.peek(c)
	if ok {
		m.used++
		m.byClient[c]++
	}
	return ok, remaining
}

func (m *model) flush(c string) {
	m.used -= m.byClient[c]
	delete(m.byClient, c)
}

// scanCalls returns the SCAN calls each master has served.
func (tc *testCluster) scanCalls(t *testing.T) []int64 {
	t.Helper()
	calls := make([]int64, len(tc.masters))
	for i, m := range tc.masters {
		stats, err := m.rdb.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatalf("%s: INFO commandstats: %v", m.addr, err)
		}
		for line := range strings.SplitSeq(stats, "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_scan:calls="); ok {
				calls[i], _ = strconv.ParseInt(rest[:strings.IndexByte(rest+",", ',')], 10, 64)
			}
		}
	}
	return calls
}

// TestClusterScanOwnMaster counts the SCAN calls each master serves while one
// resource per master goes through Allow, Peek, Flush and FlushAll: only
// the master that owns the resource's slot is scanned (with Logs it is, by
// every call; the other strategies scan at most in FlushAll).
func TestClusterScanOwnMaster(t *testing.T) {
	tc, cc := newTestCluster(t)
	ctx := context.Background()
	// A small COUNT and other keys on each master, so that each Logs SCAN
	// takes several pages.
	const others, count = 50, 10
	opts := []Option{WithScanCount(count), PerResource(Per(5, time.Minute)), PerClient(Per(3, time.Minute))}
	tc.eachStrategy(t, opts, func(t *testing.T, s Strategy, b *Bucket, prefix string) {
		for i, owner := range tc.masters {
			r := tc.resourceOn(t, owner, func(j int) string { return "scan-" + strconv.Itoa(j) })
			for j := range others { // in the resource's slot, so on its master
				if err := cc.Set(ctx, fmt.Sprintf("%s:other:{%s}:%d", prefix, keys.Encode(r), j), "", time.Minute).Err(); err != nil {
					t.Fatal(err)
				}
			}
			before := tc.scanCalls(t)
			for range 3 {
				if _, err := b.Allow(ctx, r, "c"); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := b.Peek(ctx, r, "c"); err != nil {
				t.Fatal(err)
			}
			if err := b.Flush(ctx, r, "c"); err != nil {
				t.Fatal(err)
			}
			if err := b.FlushAll(ctx, r); err != nil {
				t.Fatal(err)
			}
			after := tc.scanCalls(t)
			for j, m := range tc.masters {
				n := after[j] - before[j]
				switch {
				case j != i && n != 0:
					t.Errorf("resource %q on %s: %s served %d SCAN calls, want 0", r, owner.addr, m.addr, n)
				case j == i && s == Logs && n < 6*others/count:
					t.Errorf("resource %q: its master %s served %d SCAN calls, want at least %d (6 calls of %d pages)", r, m.addr, n, 6*others/count, others/count)
				case j == i:
					t.Logf("resource %q: %d SCAN calls on its master %s, 0 on the others", r, n, m.addr)
				}
			}
		}
	})
}

// migrate moves slot from one master to another by hand, as redis-cli
// --cluster reshard does: IMPORTING on the target, MIGRATING on the source,
// MIGRATE the keys in batches of batch (calling between after each), then
// SETSLOT NODE on every master, the target first. It waits until all masters
// agree.
func (tc *testCluster) migrate(t *testing.T, slot int, from, to *clusterMaster, batch int, between func()) {
	t.Helper()
	ctx := context.Background()
	do := func(m *clusterMaster, args ...any) {
		t.Helper()
		if err := m.rdb.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%s: %v: %v", m.addr, args, err)
		}
	}
	do(to, "cluster", "setslot", slot, "importing", from.id)
	do(from, "cluster", "setslot", slot, "migrating", to.id)
	host, port, err := net.SplitHostPort(to.addr)
	if err != nil {
		t.Fatal(err)
	}
	for {
		keys, err := from.rdb.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			t.Fatalf("%s: CLUSTER GETKEYSINSLOT: %v", from.addr, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "replace", "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		do(from, args...)
		if between != nil {
			between()
		}
	}
	do(to, "cluster", "setslot", slot, "node", to.id)
	do(from, "cluster", "setslot", slot, "node", to.id)
	for _, m := range tc.masters {
		if m != from && m != to {
			do(m, "cluster", "setslot", slot, "node", to.id)
		}
	}
	tc.waitConsistent(t)
}

// errClass names the kind of a decision's error, for the migration and
// node-stop reports.
func errClass(err error) string {
	var netErr net.Error
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	switch {
	case err == nil:
		return "none"
	case moved:
		return "MOVED"
	case ask:
		return "ASK"
	case redis.IsTryAgainError(err):
		return "TRYAGAIN"
	case redis.IsExecAbortError(err):
		return "EXECABORT"
	case errors.Is(err, ErrLockNotObtained):
		return "lock not obtained"
	case errors.Is(err, ErrLockExpired):
		return "lock expired"
	case errors.Is(err, context.DeadlineExceeded):
		return "context deadline"
	case errors.As(err, &netErr) && netErr.Timeout():
		return "net timeout"
	case errors.As(err, &netErr):
		return "net error"
	}
	return "other: " + err.Error()
}

// outcomes tallies the calls' outcomes, by phase of the test.
type outcomes struct {
	mu       sync.Mutex
	admitted int
	denied   int
	unknown  int                       // errors after which the call's write may have been applied
	byPhase  map[string]map[string]int // phase -> outcome -> count
	examples map[string]string         // error class -> one message
}

// wroteNothing reports whether a decision that failed with err certainly
// recorded nothing: it never got the lock (Logs), or its EXEC applied
// nothing (a MOVED, an ASK or an EXECABORT).
// After any other error (a timeout or a lost connection during the final
// write, say) the call may have been recorded; the library says so.
func wroteNothing(err error) bool {
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	return errors.Is(err, ErrLockNotObtained) || errors.Is(err, ErrLockExpired) ||
		redis.IsExecAbortError(err) || moved || ask || redis.IsTryAgainError(err)
}

func (o *outcomes) add(phase string, res Result, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.byPhase[phase] == nil {
		o.byPhase[phase] = map[string]int{}
	}
	switch {
	case err != nil:
		class := errClass(err)
		o.byPhase[phase]["error "+class]++
		if !wroteNothing(err) {
			o.unknown++
		}
		if _, ok := o.examples[class]; !ok {
			o.examples[class] = err.Error()
		}
	case res.Allowed:
		o.admitted++
		o.byPhase[phase]["admitted"]++
	default:
		o.denied++
		o.byPhase[phase]["denied"]++
	}
}

// TestClusterMigration moves a resource's slot to another master while 32
// goroutines keep calling Allow on it, then moves it back the same way.
// Calls may fail while the slot moves, but the resource must admit exactly
// its limit, and calls must work again once the slot has moved.
//
// A call that fails after its write may have been applied (a timeout during
// the final EXEC: each call has 5s, which a loaded machine rarely uses up)
// may be one of the limit's admissions: the callers must have seen between
// the limit less those calls and the limit admitted, and Redis must count
// the limit exactly.
func TestClusterMigration(t *testing.T) {
	tc, _ := newTestCluster(t)
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			testMigration(t, tc, s)
		})
	}
}

func testMigration(t *testing.T, tc *testCluster, s Strategy) {
	const (
		limit   = 40
		workers = 32
	)
	cc := clusterClient(t, s, nil) // its own, so that its slot map is fresh
	prefix := uniquePrefix(t)
	defer tc.cleanPrefix(prefix)
	b, err := New(cc, WithStrategy(s), WithPrefix(prefix), PerResource(Per(limit, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	const resource = "migrating"
	slot := tc.slot(t, keys.Of(prefix, resource).Slot())
	from := tc.owner(t, slot)
	to := tc.masters[(slices.Index(tc.masters, from)+1)%len(tc.masters)]
	moved := false
	t.Cleanup(func() {
		if moved { // put the slot back, so later tests see the layout they expect
			tc.migrate(t, slot, to, from, 100, nil)
		}
	})

	var phase atomic.Value
	phase.Store("before")
	o := &outcomes{byPhase: map[string]map[string]int{}, examples: map[string]string{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				res, err := b.Allow(ctx, resource, "c")
				cancel()
				o.add(phase.Load().(string), res, err)
			}
		})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	admitted := func() int { o.mu.Lock(); defer o.mu.Unlock(); return o.admitted }
	deniedAfter := func() int { o.mu.Lock(); defer o.mu.Unlock(); return o.byPhase["after"]["denied"] }

	// Move the slot once part of the limit is used, in small batches, so
	// that decisions meet a slot half moved. (The waits below end as soon as
	// their condition holds; their 30s only bound a failing test.)
	for deadline := time.Now().Add(30 * time.Second); admitted() < limit/4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("admitted %d in 30s before the migration", admitted())
		}
	}
	phase.Store("during")
	start := time.Now()
	tc.migrate(t, slot, from, to, 3, func() { time.Sleep(2 * time.Millisecond) })
	moved = true
	took := time.Since(start)
	phase.Store("after")

	// Calls must work again: run until the limit has been hit many times over.
	deadline := time.Now().Add(30 * time.Second)
	for deniedAfter() < 10*limit && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	t.Logf("%s: slot %d moved from %s to %s in %v", s, slot, from.addr, to.addr, took.Round(time.Millisecond))
	for _, p := range []string{"before", "during", "after"} {
		t.Logf("  %s: %v", p, o.byPhase[p])
	}
	for class, msg := range o.examples {
		t.Logf("  e.g. %s: %s", class, msg)
	}
	if o.admitted > limit || o.admitted+o.unknown < limit {
		t.Errorf("admitted %d in all, and %d calls failed after their write may have been applied; want exactly %d", o.admitted, o.unknown, limit)
	}
	if deniedAfter() < 10*limit {
		t.Errorf("after the migration only %d calls were denied in 30s: calls did not work again", deniedAfter())
	}
	if keys := from.keysOn(t, prefix); len(keys) > 0 {
		t.Errorf("%s still holds %d keys of the moved slot, as %q", from.addr, len(keys), keys[0])
	}
	if res, err := b.Peek(context.Background(), resource, "c"); err != nil || res.Allowed || res.Rules[0].Used != limit {
		t.Errorf("Peek after the migration = %+v, %v; want %d used, denied", res, err, limit)
	}
}

// pausedMaster stops m's process (SIGSTOP) until resume is called, or the
// test ends. It first checks that the pid is the server's own.
func pausedMaster(t *testing.T, m *clusterMaster) (resume func()) {
	t.Helper()
	if m.pid == 0 {
		t.Fatalf("%s is not set: the node-stop test needs the masters' pids", clusterPidsVar)
	}
	info, err := m.rdb.Info(context.Background(), "server").Result()
	if err != nil || !strings.Contains(info, "process_id:"+strconv.Itoa(m.pid)+"\r\n") {
		t.Fatalf("%s: pid %d is not its process_id (%v)", m.addr, m.pid, err)
	}
	if err := syscall.Kill(m.pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := syscall.Kill(m.pid, syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}

// TestClusterNodeStop pauses one master (SIGSTOP, well under the cluster's
// node timeout): calls for a resource on it fail within their context's
// deadline with a wrapped error, calls for a resource on another master go
// on, and once it resumes (SIGCONT) its resource works again, with its
// counts intact.
//
// Its time bounds are set against what a bug would cost, not against how
// fast an idle machine is, so that a loaded one cannot break them: the
// client's own I/O timeouts are long (nodeStopIOTimeout), so a call that
// ignored its context would take seconds more than the bound allows.
func TestClusterNodeStop(t *testing.T) {
	tc, _ := newTestCluster(t, func(o *redis.ClusterOptions) {
		o.ReadTimeout, o.WriteTimeout = nodeStopIOTimeout, nodeStopIOTimeout
	})
	const lockTTL = 500 * time.Millisecond
	opts := []Option{WithLockTTL(lockTTL), PerResource(Per(10, time.Minute))}
	tc.eachStrategy(t, opts, func(t *testing.T, s Strategy, b *Bucket, _ string) {
		stopped, running := tc.masters[1], tc.masters[2]
		rStopped := tc.resourceOn(t, stopped, func(i int) string { return "stopped-" + strconv.Itoa(i) })
		rRunning := tc.resourceOn(t, running, func(i int) string { return "running-" + strconv.Itoa(i) })
		for _, r := range []string{rStopped, rRunning} {
			if res, err := b.Allow(context.Background(), r, "c"); err != nil || !res.Allowed {
				t.Fatalf("Allow(%q) = %+v, %v", r, res, err)
			}
		}

		resume := pausedMaster(t, stopped)
		paused := time.Now()
		for i := range 2 {
			allowOnStopped(t, s, b, rStopped, i)
			allowOnRunning(t, b, rRunning)
		}
		resume()
		t.Logf("%s: master paused for %v", s, time.Since(paused).Round(time.Millisecond))

		// The stopped master runs, once resumed, the SET NX of the calls
		// that gave up: the lock stays taken until its TTL ends, and no
		// call was counted. Waiting much longer than the TTL (the default
		// TTL of 2s, say) would take longer than the bound. SortedSet and
		// Windows take no lock: the master runs the transactions of the
		// calls that gave up as it resumes, and the Bucket takes them back
		// (txn.resolve) within a few round trips.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		if !slices.Contains(lockedStrategies, s) {
			awaitUsed(t, b, rStopped, 1, time.Second)
		}
		res, err := b.Allow(ctx, rStopped, "c")
		took := time.Since(start)
		// Windows admits a call far from its limit on a bound of its
		// count, whose Used may be more (see Result): the count itself is
		// read whole by Peek.
		if err != nil || !res.Allowed || res.Rules[0].Used < 2 {
			t.Fatalf("Allow(%q) after SIGCONT = %+v, %v; want admitted, 2 used", rStopped, res, err)
		}
		if now, err := b.Peek(ctx, rStopped, "c"); err != nil || counted(now, 0) != 2 {
			t.Fatalf("Peek(%q) after the Allow = %+v, %v; want 2 used", rStopped, now, err)
		}
		if took > lockTTL+time.Second {
			t.Errorf("Allow after SIGCONT took %v, want at most the lock TTL %v (and a second for a loaded machine)", took, lockTTL)
		}
		t.Logf("%s: works again %v after SIGCONT", s, took.Round(time.Millisecond))
	})
}

const (
	// nodeStopIOTimeout is the read and write timeout of the node-stop
	// test's client: what a round trip to the stopped master lasts if its
	// context does not end it.
	nodeStopIOTimeout = 10 * time.Second
	// stoppedDeadline is the deadline of each call to the stopped master.
	stoppedDeadline = 500 * time.Millisecond
	// stoppedBound is how long such a call may take: its deadline, the
	// lock's cleanup (at most 100ms) and seconds for a loaded machine, yet
	// far less than nodeStopIOTimeout.
	stoppedBound = stoppedDeadline + 3*time.Second
)

// allowOnStopped calls Allow for resource r, on the stopped master: it must
// fail with a wrapped deadline or timeout error, within stoppedBound.
func allowOnStopped(t *testing.T, s Strategy, b *Bucket, r string, i int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stoppedDeadline)
	defer cancel()
	start := time.Now()
	_, err := b.Allow(ctx, r, "c")
	took := time.Since(start)
	t.Logf("%s: Allow on the stopped master: %v after %v: %v", s, errClass(err), took.Round(time.Millisecond), err)
	if err == nil {
		t.Fatalf("call %d: Allow(%q) on the stopped master succeeded", i, r)
	}
	if !strings.HasPrefix(err.Error(), "leakybucket: ") {
		t.Errorf("error %q is not wrapped by the package", err)
	}
	if c := errClass(err); c != "context deadline" && c != "net timeout" && c != "lock not obtained" {
		t.Errorf("error %q is of class %q, want a deadline or network timeout", err, c)
	}
	if took > stoppedBound {
		t.Errorf("Allow on the stopped master took %v, want about the %v deadline (at most %v); its I/O timeout is %v",
			took, stoppedDeadline, stoppedBound, nodeStopIOTimeout)
	}
}

// allowOnRunning calls Allow for resource r, on a running master, while
// another is stopped: it must succeed, within a deadline that a call held
// up by the stopped master would reach, as the master stays stopped.
func allowOnRunning(t *testing.T, b *Bucket, r string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	res, err := b.Allow(ctx, r, "c")
	if took := time.Since(start); err != nil || !res.Allowed {
		t.Errorf("Allow(%q) on a running master while another is stopped = %+v, %v after %v", r, res, err, took)
	}
}

// redirecting is a miniredis that the cluster client sees as a cluster of
// one node, which answers MOVED (to itself) to the commands named in moved,
// while it is set, and counts the CLUSTER SLOTS calls of slot map reloads.
type redirecting struct {
	m     *miniredis.Miniredis
	moved atomic.Value // map[string]bool, lower case; nil: none
	loads atomic.Int64
}

func newRedirecting(t *testing.T) *redirecting {
	r := &redirecting{m: miniredis.RunT(t)}
	r.m.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		cmd = strings.ToLower(cmd)
		// A load of the slot map: go-redis v9.24 asks CLUSTER SHARDS, and
		// CLUSTER SLOTS where that is refused or missing.
		if cmd == "cluster" && len(args) > 0 && (strings.EqualFold(args[0], "slots") || strings.EqualFold(args[0], "shards")) {
			r.loads.Add(1)
		}
		if moved, _ := r.moved.Load().(map[string]bool); moved[cmd] {
			c.WriteError("MOVED 1234 " + r.m.Addr())
			return true
		}
		return false
	})
	return r
}

func (r *redirecting) answerMoved(cmds ...string) {
	moved := map[string]bool{}
	for _, c := range cmds {
		moved[c] = true
	}
	r.moved.Store(moved)
}

// A decision answered MOVED returns the error, wrapped, and makes the
// cluster client reload its slot map, so that later calls find the new
// owner. A Bucket on a *redis.Client has nothing to reload.
func TestClusterRouteReloadsOnMoved(t *testing.T) {
	t.Parallel()
	r := newRedirecting(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.m.Addr()}})
	defer cc.Close()
	ctx := context.Background()
	b, err := New(cc, PerResource(Per(3, time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed {
		t.Fatalf("Allow = %+v, %v", res, err)
	}
	loaded := r.loads.Load()
	r.answerMoved("set")
	_, err = b.Allow(ctx, "r", "c")
	if _, moved := redis.IsMovedError(err); !moved || !strings.HasPrefix(err.Error(), "leakybucket: MOVED") {
		t.Fatalf("Allow answered MOVED = %v; want the MOVED error, wrapped", err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.loads.Load() == loaded; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slot map was not reloaded after MOVED")
		}
	}
	r.answerMoved()
	if res, err := b.Allow(ctx, "r", "c"); err != nil || !res.Allowed || res.Remaining != 1 {
		t.Fatalf("Allow after the reload = %+v, %v; want admitted, 1 left (the MOVED call wrote nothing)", res, err)
	}
}

// A master that does not own the slot any more still answers SCAN and TIME,
// from keys it does not have. On a cluster client, a Logs Peek and a
// FlushAll that scans also send EXISTS on the slot, and fail with its MOVED
// rather than answer from nothing; on a *redis.Client they send no EXISTS.
func TestClusterRouteGuardsKeylessReads(t *testing.T) {
	t.Parallel()
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			r := newRedirecting(t)
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{r.m.Addr()}})
			defer cc.Close()
			ctx := context.Background()
			b, err := New(cc, WithStrategy(s), PerResource(Per(3, time.Minute)), PerClient(Per(3, time.Minute)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Allow(ctx, "r", "c"); err != nil {
				t.Fatal(err)
			}
			// As on a node that lost the slot: its keys are gone, and only
			// keyed commands are redirected; SCAN and TIME are answered.
			r.m.FlushAll()
			r.answerMoved("exists", "del", "zrange", "zrangebyscore", "hgetall", "hmget", "get", "set", "watch")
			if res, err := b.Peek(ctx, "r", "c"); err == nil {
				t.Errorf("Peek on a node without the slot = %+v; want MOVED", res)
			} else if _, moved := redis.IsMovedError(err); !moved {
				t.Errorf("Peek on a node without the slot: %v; want MOVED", err)
			}
			if err := b.FlushAll(ctx, "r"); err == nil {
				t.Error("FlushAll on a node without the slot succeeded; want MOVED")
			} else if _, moved := redis.IsMovedError(err); !moved {
				t.Errorf("FlushAll on a node without the slot: %v; want MOVED", err)
			}
			r.answerMoved()
			if res, err := b.Peek(ctx, "r", "c"); err != nil || res.Remaining != 2 {
				t.Errorf("Peek on the owner = %+v, %v; want 2 left", res, err)
			}
		})
	}
	t.Run("client", func(t *testing.T) {
		t.Parallel()
		r := newRedirecting(t)
		rdb := redis.NewClient(&redis.Options{Addr: r.m.Addr()})
		defer rdb.Close()
		b, err := New(rdb, PerResource(Per(3, time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		r.answerMoved("exists")
		if _, err := b.Peek(context.Background(), "r", "c"); err != nil {
			t.Errorf("Peek on a *redis.Client sent EXISTS: %v", err)
		}
		if err := b.FlushAll(context.Background(), "r"); err != nil {
			t.Errorf("FlushAll on a *redis.Client sent EXISTS: %v", err)
		}
	})
}

// awaitUsed waits until Peek shows want used under the first rule of b at
// resource, for at most d.
func awaitUsed(t *testing.T, b *Bucket, resource string, want int, d time.Duration) {
	t.Helper()
	var res Result
	var err error
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if res, err = b.Peek(context.Background(), resource, "c"); err == nil && counted(res, 0) == want {
			return
		}
	}
	t.Fatalf("Peek(%q) = %+v, %v for %v; want %d used", resource, res, err, d, want)
}
