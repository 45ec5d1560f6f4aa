package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
)

// WithReplicas on servers whose replicas do not acknowledge: miniredis
// (WAIT answers 0 at once), the real Redis and the real cluster's masters
// (no replicas: WAIT 1 answers 0 after its timeout). Every call fails as
// unavailable, with ErrNotReplicated, within its deadline; nothing it wrote
// stays counted (the keys are read); the breaker stays closed (Peek still
// reaches Redis); the client sends only its strategy's commands and WAIT,
// as an ACL user allowed those alone. With the acknowledgement (a hook
// makes miniredis answer 1), the same Bucket admits exactly its limit.
func TestReplicasUnacknowledged(t *testing.T) {
	t.Parallel()
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			t.Run("miniredis", func(t *testing.T) {
				t.Parallel()
				m := miniredis.RunT(t)
				acks := &atomic.Int64{}
				m.Server().SetPreHook(ackedBy(acks))
				srv := replicaServer{rdb: redis.NewClient(&redis.Options{Addr: m.Addr()}), admin: redis.NewClient(&redis.Options{Addr: m.Addr()})}
				checkUnacknowledged(t, s, srv)
				acks.Store(1)
				checkAcknowledged(t, s, srv)
			})
			t.Run("redis", func(t *testing.T) {
				t.Parallel()
				opts := libraryOptions(realAddrOrSkip(t), strategyName(s), 16)
				opts.Username = replicaUserOf(strategyName(s))
				checkUnacknowledged(t, s, replicaServer{rdb: redis.NewClient(opts), admin: realAdmin(t), real: true})
			})
			t.Run("cluster", func(t *testing.T) {
				t.Parallel()
				log := &commandLog{}
				cc := newClusterClient(t, replicaUserOf(strategyName(s)), testUsers.password)
				cc.OnNewNode(func(node *redis.Client) { node.AddHook(log) })
				checkUnacknowledged(t, s, replicaServer{rdb: cc, admin: clusterAdmin(t), real: true, log: log})
			})
		})
	}
}

// replicaServer is where a test of WithReplicas runs: the Bucket's client,
// the test's own, and what the Bucket's sent (nil: logged here).
type replicaServer struct {
	rdb, admin redis.UniversalClient
	real       bool // WAIT waits its timeout there
	log        *commandLog
}

// ackedBy is a miniredis hook that answers WAIT with how many replicas
// acks holds.
func ackedBy(acks *atomic.Int64) server.Hook {
	return func(c *server.Peer, cmd string, _ ...string) bool {
		if !strings.EqualFold(cmd, "wait") {
			return false
		}
		c.WriteInt(int(acks.Load()))
		return true
	}
}

// replicaRules are the rules of these tests: per client and per resource,
// so that every strategy writes to both kinds of keys.
func replicaRules() []Option {
	return []Option{PerClient(Per(5, time.Minute)), PerResource(Per(100, time.Minute))}
}

func checkUnacknowledged(t *testing.T, s Strategy, srv replicaServer) {
	t.Helper()
	ctx := context.Background()
	prefix := uniquePrefix(t)
	if srv.log == nil {
		srv.log = &commandLog{}
		srv.rdb.AddHook(srv.log)
	}
	_, cluster := srv.rdb.(*redis.ClusterClient)
	t.Cleanup(func() {
		cleanPrefix(srv.admin, prefix)
		_ = srv.rdb.Close()
		if bad := unexpectedWithReplicas(srv.log, strategyName(s), cluster); len(bad) > 0 {
			t.Errorf("sent %q, which is neither listed for %v nor WAIT", bad, s)
		}
	})
	b, err := New(srv.rdb, append(replicaRules(), WithStrategy(s), WithPrefix(prefix), WithReplicas(1, 20*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	if bad := unreplicatedCalls(b, 8, 2*time.Second); len(bad) > 0 {
		t.Errorf("%d calls were not unavailable and not replicated, within their deadline; first: %s", len(bad), bad[0])
	}
	if srv.real {
		// A wait longer than the deadline: the call still ends in time,
		// and says why.
		slow, err := New(srv.rdb, append(replicaRules(), WithStrategy(s), WithPrefix(prefix), WithReplicas(1, 10*time.Second))...)
		if err != nil {
			t.Fatal(err)
		}
		if bad := unreplicatedCalls(slow, 2, time.Second); len(bad) > 0 {
			t.Errorf("a wait of 10s under a deadline of 1s: %d calls were not unavailable and not replicated, within their deadline; first: %s", len(bad), bad[0])
		}
	}
	if w := waitUncounted(t, srv.admin, prefix); w != 0 {
		t.Errorf("the keys still count %d units after the take-backs: %q", w, keysUnder(t, srv.admin, prefix))
	}
	res, err := b.Peek(ctx, "r", "c0")
	if err != nil || !res.Allowed || res.Rules[0].Remaining != 4 || res.Rules[1].Remaining != 99 {
		t.Errorf("Peek = %+v, %v: want nothing counted (4 and 99 left after one more), and the breaker closed", res, err)
	}
}

// checkAcknowledged: with every decision acknowledged, a Bucket
// WithReplicas counts as any other: 5 per client admitted, then denied.
func checkAcknowledged(t *testing.T, s Strategy, srv replicaServer) {
	t.Helper()
	ctx := context.Background()
	b, err := New(srv.rdb, append(replicaRules(), WithStrategy(s), WithPrefix(uniquePrefix(t)), WithReplicas(1, 20*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 7 {
		res, err := b.Allow(ctx, "r", "c")
		if err != nil {
			t.Fatalf("acknowledged: %v", err)
		}
		if res.Allowed {
			admitted++
		}
	}
	if res, err := b.Peek(ctx, "r", "c"); admitted != 5 || err != nil || res.Allowed || res.Rules[0].Used != 5 {
		t.Errorf("acknowledged: %d admitted of 7, Peek %+v, %v: want 5, used 5", admitted, res, err)
	}
}

// unreplicatedCalls makes three calls of b from each of clients clients
// at once, each with deadline, and describes those that did not fail as
// unavailable and not replicated, by their deadline, bar 20 ms and however
// late the scheduler woke a sleeping goroutine meanwhile, which the
// library cannot help (on a loaded 2-core machine, tens of ms).
func unreplicatedCalls(b *Bucket, clients int, deadline time.Duration) []string {
	return callsAtOnce(b, clients, deadline, func(res Result, err error) bool {
		return errors.Is(err, ErrUnavailable) && errors.Is(err, ErrNotReplicated) && !res.Allowed
	})
}

// callsAtOnce makes three calls of b from each of clients clients at
// once, each with deadline, and describes those of which want is false,
// or that did not end by their deadline, bar 20 ms and the scheduler's
// lag (see unreplicatedCalls).
func callsAtOnce(b *Bucket, clients int, deadline time.Duration, want func(Result, error) bool) []string {
	type call struct {
		res  Result
		err  error
		took time.Duration
	}
	var wg sync.WaitGroup
	calls := make([][3]call, clients)
	lag := schedulerLag(func() {
		for c := range clients {
			wg.Go(func() {
				for i := range calls[c] {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					start := time.Now()
					res, err := b.Allow(ctx, "r", "c"+strconv.Itoa(c))
					calls[c][i] = call{res, err, time.Since(start)}
					cancel()
				}
			})
		}
		wg.Wait()
	})
	var bad []string
	for _, cs := range calls {
		for _, c := range cs {
			if !want(c.res, c.err) || c.took > deadline+20*time.Millisecond+lag {
				bad = append(bad, fmt.Sprintf("%+v, %v after %v (the scheduler's lag: %v)", c.res, c.err, c.took.Round(time.Millisecond), lag.Round(time.Millisecond)))
			}
		}
	}
	return bad
}

// schedulerLag runs f, and returns how late, at worst, a 1 ms sleep woke
// up meanwhile.
func schedulerLag(f func()) time.Duration {
	var worst atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchScheduler(stop, func(late time.Duration) {
			if int64(late) > worst.Load() {
				worst.Store(int64(late))
			}
		})
	}()
	f()
	close(stop)
	<-done
	return time.Duration(worst.Load())
}

// unexpectedWithReplicas returns what log shows sent that a Bucket of
// strategy s WithReplicas may not send: its strategy's, go-redis's own and
// WAIT are allowed.
func unexpectedWithReplicas(log *commandLog, s string, cluster bool) []string {
	var bad []string
	for _, c := range log.unexpected(s, cluster) {
		if !strings.EqualFold(c, "wait") {
			bad = append(bad, c)
		}
	}
	return bad
}

// weightUnder returns the weight the keys under prefix count, read from the
// keys themselves: the weight in each log's name (Logs), each set's
// members (SortedSet), each hash's intervals (Windows; a call counts in
// the resource's hash and in its client's).
func weightUnder(t testing.TB, admin redis.UniversalClient, prefix string) int {
	t.Helper()
	ctx := context.Background()
	total := 0
	for _, key := range countsOnly(keysUnder(t, admin, prefix)) {
		switch {
		case strings.Contains(key, "}:log:"):
			parts := strings.Split(key, ":")
			n, _ := strconv.Atoi(parts[len(parts)-2])
			total += n
		case strings.Contains(key, "}:zset:"):
			n, err := admin.ZCard(ctx, key).Result()
			if err != nil {
				t.Fatalf("ZCARD %s: %v", key, err)
			}
			total += int(n)
		case strings.Contains(key, "}:hash"):
			fields, err := admin.HGetAll(ctx, key).Result()
			if err != nil {
				t.Fatalf("HGETALL %s: %v", key, err)
			}
			for field, n := range heldFields(fields) {
				if field != "i" {
					total += n
				}
			}
		}
	}
	return total
}

// waitUncounted returns what the keys under prefix count once it is 0, or
// after a second: a caller whose deadline ended first may return before
// its batch's take-back ran.
func waitUncounted(t testing.TB, admin redis.UniversalClient, prefix string) int {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		w := weightUnder(t, admin, prefix)
		if w == 0 || time.Now().After(deadline) {
			return w
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReplicasFallback: WithReplicas and WithFallback, on a server whose
// replicas do not acknowledge (miniredis, its WAIT answering 0): every
// call is decided by the fallback, in process, by its share (the limit,
// for one instance), with no error; nothing stays counted on Redis, whose
// breaker stays closed (Peek reads Redis); once the replicas acknowledge,
// the calls are decided on Redis again, which counts from nothing.
func TestReplicasFallback(t *testing.T) {
	t.Parallel()
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			m := miniredis.RunT(t)
			acks := &atomic.Int64{}
			m.Server().SetPreHook(ackedBy(acks))
			rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			b, err := New(rdb, append(replicaRules(), WithStrategy(s), WithReplicas(1, 20*time.Millisecond), WithFallback(1))...)
			if err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for i := range 7 {
				res, err := b.Allow(ctx, "r", "c")
				if err != nil || !res.Fallback {
					t.Fatalf("call %d, not acknowledged: %+v, %v: want decided by the fallback, no error", i, res, err)
				}
				if res.Allowed {
					admitted++
				}
			}
			if admitted != 5 {
				t.Errorf("the fallback admitted %d of 7 calls, want its share, 5", admitted)
			}
			if w := weightUnder(t, rdb, defaultPrefix); w != 0 {
				t.Errorf("Redis's keys count %d units after the take-backs: %q", w, keysUnder(t, rdb, defaultPrefix))
			}
			if res, err := b.Peek(ctx, "r", "c"); err != nil || res.Fallback || res.Rules[0].Remaining != 4 {
				t.Errorf("Peek = %+v, %v: want read on Redis (the breaker closed), nothing counted (4 left after one more)", res, err)
			}
			acks.Store(1)
			if res, err := b.Allow(ctx, "r", "c"); err != nil || res.Fallback || !res.Allowed || res.Rules[0].Remaining != 4 {
				t.Errorf("acknowledged: %+v, %v: want admitted on Redis, 4 left", res, err)
			}
		})
	}
}
