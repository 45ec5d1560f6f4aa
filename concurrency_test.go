package leakybucket

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// The concurrency tests admit exactly the limit with 64 goroutines in this
// process and 64 in each of three child processes (this test binary again,
// dispatched by TestMain), all calling at once on one Redis.

const (
	helperVar       = "LEAKYBUCKET_TEST_HELPER" // a JSON helperJob: run as a child process
	childProcesses  = 3
	childGoroutines = 64
	goroutines      = 64
	callsEach       = 4
)

type helperJob struct {
	Addr, Prefix, Scenario, Strategy string

	// On the real Redis: the database, and the ACL user of the strategy
	// (acl_test.go) as whom the Buckets run; the test's own commands run as
	// the default user.
	DB             int
	User, Password string
}

// admin returns a client for the test's own commands.
func (job helperJob) admin() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: job.Addr, DB: job.DB})
}

// library returns a client for the Buckets, with a pool of n connections.
func (job helperJob) library(n int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: job.Addr, DB: job.DB, Username: job.User, Password: job.Password, PoolSize: n})
}

// concurrentStrategies are the strategies of the concurrency tests, by name.
// Windows runs at a coarse precision: it never over-admits, and no call
// leaves the one-minute windows during the test, so it too must admit
// exactly the limit.
var concurrentStrategies = map[string]Strategy{
	"logs":       Logs,
	"sorted set": SortedSet,
	"windows":    Windows(time.Second),
}

// scenarios name the rules and clients of each concurrency test.
var scenarios = map[string]struct {
	rules   []Option
	clients []string
}{
	// One hot (resource, client).
	"hot": {[]Option{PerClient(Per(50, time.Minute))}, []string{"a"}},
	// The notification sender: 30 in all, 8 per client, 6 clients.
	"hierarchy": {
		[]Option{PerResource(Per(30, time.Minute)), PerClient(Per(8, time.Minute))},
		[]string{"c0", "c1", "c2", "c3", "c4", "c5"},
	},
}

func TestConcurrentProcessesMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t) // a TCP server, so that child processes reach it
	testConcurrency(t, m.Addr(), "t", false)
}

func TestConcurrentProcessesRedis(t *testing.T) {
	t.Parallel()
	testConcurrency(t, realAddrOrSkip(t), uniquePrefix(t), true)
}

func testConcurrency(t *testing.T, addr, prefix string, real bool) {
	for strategy := range concurrentStrategies {
		for _, name := range []string{"hot", "hierarchy"} {
			t.Run(strategy+"/"+name, func(t *testing.T) {
				job := helperJob{Addr: addr, Prefix: prefix + ":" + strategy + ":" + name, Scenario: name, Strategy: strategy}
				if real {
					opts := libraryOptions(addr, strategyName(concurrentStrategies[strategy]), 1)
					job.DB, job.User, job.Password = opts.DB, opts.Username, opts.Password
				}
				testScenario(t, job)
			})
		}
	}
}

// testScenario runs job in this process and in the child processes, and
// checks what they admitted together.
func testScenario(t *testing.T, job helperJob) {
	rdb := job.admin()
	defer rdb.Close()
	ctx := context.Background()
	defer cleanPrefix(rdb, job.Prefix)

	spec, _ := json.Marshal(job)
	children := make([]*exec.Cmd, childProcesses)
	outputs := make([][]byte, childProcesses)
	var wg sync.WaitGroup
	for i := range children {
		children[i] = exec.Command(os.Args[0], "-test.run=^$")
		children[i].Env = append(os.Environ(), helperVar+"="+string(spec))
		wg.Go(func() {
			var err error
			outputs[i], err = children[i].Output()
			if err != nil {
				t.Errorf("child %d: %v\n%s", i, err, outputs[i])
			}
		})
	}
	// Start everyone at once: children report ready, then all go.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if n, _ := rdb.Get(ctx, job.Prefix+":ready").Int(); n == childProcesses {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("child processes did not start")
		}
	}
	rdb.Set(ctx, job.Prefix+":go", 1, time.Minute)
	admitted := runJob(t, job, goroutines)
	wg.Wait()
	for i, out := range outputs {
		var theirs map[string]int
		if err := json.Unmarshal(out, &theirs); err != nil {
			t.Fatalf("child %d printed %q: %v", i, out, err)
		}
		for c, n := range theirs {
			admitted[c] += n
		}
	}
	checkAdmitted(t, job.Scenario, admitted)
}

// checkAdmitted compares the admitted counts with the scenario's limits.
func checkAdmitted(t *testing.T, name string, admitted map[string]int) {
	t.Helper()
	total := 0
	for _, n := range admitted {
		total += n
	}
	switch name {
	case "hot":
		if total != 50 {
			t.Errorf("admitted %d, want exactly 50", total)
		}
	case "hierarchy":
		if total != 30 {
			t.Errorf("admitted %d in all, want exactly 30", total)
		}
		for c, n := range admitted {
			if n > 8 {
				t.Errorf("client %s admitted %d, want at most 8", c, n)
			}
		}
	}
}

// runJob runs the scenario's calls from n goroutines once the go key is set
// and returns how many each client had admitted.
func runJob(t testing.TB, job helperJob, n int) map[string]int {
	spec := scenarios[job.Scenario]
	rdb := job.library(n)
	defer rdb.Close()
	admin := job.admin()
	defer admin.Close()
	b, err := New(rdb, append([]Option{WithStrategy(concurrentStrategies[job.Strategy]), WithPrefix(job.Prefix)}, spec.rules...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for admin.Exists(ctx, job.Prefix+":go").Val() == 0 {
		time.Sleep(time.Millisecond)
	}
	return callScenario(t, b, spec.clients, n, nil)
}

// callScenario makes callsEach calls from each of n goroutines, which
// start together once start is closed (at once if nil), cycling through
// clients, and returns how many each client had admitted.
func callScenario(t testing.TB, b *Bucket, clients []string, n int, start chan struct{}) map[string]int {
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			if start != nil {
				<-start
			}
			for i := range callsEach {
				client := clients[(g+i)%len(clients)]
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				res, err := b.Allow(ctx, "resource", client)
				cancel()
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if res.Allowed {
					mu.Lock()
					admitted[client]++
					mu.Unlock()
				}
			}
		})
	}
	if start != nil {
		close(start)
	}
	wg.Wait()
	return admitted
}

// helperMain is the body of a child process: it prints its admitted counts
// as JSON and returns the exit code.
func helperMain(spec string) int {
	var job helperJob
	if err := json.Unmarshal([]byte(spec), &job); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	rdb := job.admin()
	rdb.Incr(context.Background(), job.Prefix+":ready")
	rdb.Close()
	t := &helperT{}
	admitted := runJob(t, job, childGoroutines)
	if t.failed {
		return 1
	}
	out, _ := json.Marshal(admitted)
	fmt.Println(string(out))
	return 0
}

// helperT is the testing.TB of a child process: it reports to stderr.
type helperT struct {
	testing.TB
	mu     sync.Mutex
	failed bool
}

func (h *helperT) Errorf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = true
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (h *helperT) Fatal(args ...any) {
	fmt.Fprintln(os.Stderr, args...)
	os.Exit(1)
}

// cleanPrefix deletes every key that starts with prefix.
func cleanPrefix(rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	_ = forEachNode(rdb, func(node *redis.Client) error {
		iter := node.Scan(ctx, 0, keys.MatchPrefix(prefix), 1000).Iterator()
		for iter.Next(ctx) {
			node.Del(ctx, iter.Val())
		}
		return iter.Err()
	})
}

const (
	burstCalls = 50 // at once, from one process
	burstLimit = 10
	bursts     = 40 // each on a resource of its own
)

// TestBurstAdmitsExactlyTheLimit: 50 calls at once from one process, on a
// limit of 10 per resource and 50 per client (as an HTTP API behind one
// instance meets them), admit exactly 10, burst after burst. The batches of
// a resource's line may each count what another batch of the same line
// wrote and then takes back (a call decided again, or denied): a call
// denied on that weight is one that no later call of the burst makes up
// for, and the burst admits less than its limit.
func TestBurstAdmitsExactlyTheLimit(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerResource(PerMinute(burstLimit)), PerClient(PerMinute(burstCalls)))
		short := 0
		for i := range bursts {
			resource := fmt.Sprintf("burst-%d", i)
			var admitted sync.WaitGroup
			var mu sync.Mutex
			n := 0
			for c := range burstCalls {
				admitted.Go(func() {
					// Spread over 2 ms, as requests reach a server:
					// many small batches, each beside another.
					time.Sleep(time.Duration(c%20) * 100 * time.Microsecond)
					res, err := b.Allow(context.Background(), resource, fmt.Sprintf("c%d", c%5))
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						mu.Lock()
						n++
						mu.Unlock()
					}
				})
			}
			admitted.Wait()
			if n > burstLimit {
				t.Fatalf("burst %d admitted %d, limit %d", i, n, burstLimit)
			}
			if n < burstLimit {
				short++
				t.Errorf("burst %d admitted %d of %d calls at once, limit %d", i, n, burstCalls, burstLimit)
			}
		}
		if short > 0 {
			t.Errorf("%d of %d bursts admitted less than the limit", short, bursts)
		}
	})
}

// TestBurstAdmitsEachClientsLimit: where every rule is per-client, the
// clients of a resource queue in more than one line (store.lockFree.Line),
// whose batches are under way at once. A client's calls must still share
// one line: two batches of one client's calls under way at once would
// each count what the other then takes back, and the burst would admit
// less than the client's limit; and none may admit more.
func TestBurstAdmitsEachClientsLimit(t *testing.T) {
	const clients = 5
	each(t, func(t *testing.T, e *env) {
		b := e.bucket(t, PerClient(PerMinute(burstLimit)))
		for i := range bursts {
			resource := fmt.Sprintf("burst-%d", i)
			var calls sync.WaitGroup
			var admitted [clients]atomic.Int64
			for c := range burstCalls * 2 {
				calls.Go(func() {
					time.Sleep(time.Duration(c%20) * 100 * time.Microsecond) // as in TestBurstAdmitsExactlyTheLimit
					res, err := b.Allow(context.Background(), resource, fmt.Sprintf("c%d", c%clients))
					if err != nil {
						t.Error(err)
						return
					}
					if res.Allowed {
						admitted[c%clients].Add(1)
					}
				})
			}
			calls.Wait()
			for c := range admitted {
				if n := admitted[c].Load(); n != burstLimit {
					t.Errorf("burst %d: client c%d admitted %d of %d calls at once, limit %d", i, c, n, burstCalls*2/clients, burstLimit)
				}
			}
		}
	})
}
