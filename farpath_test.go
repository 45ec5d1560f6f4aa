package leakybucket

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// The adversary of SortedSet's lean transaction: a call that every rule
// showed room for, with a margin, is sent without the read of its sets'
// oldest members, and decided again if the counts deny it. Several Buckets
// (as several processes) share one Redis; a client hammers its own limit
// with weight 3 beside polite clients of weights 1 and 2, while another
// Bucket calls Flush and FlushAll. Every call and flush takes a number
// from one counter when it starts and when it returns, so that what each
// rule may have admitted is proven by intervals: the calls that started
// after a flush returned and returned before the next one started were
// all counted together, and admitted at most each rule's limit. Then,
// with no flush, the resource is filled: it must admit exactly its limit,
// and count exactly what it admitted.

const (
	farResource  = 100 // per resource, a minute
	farClient    = 30  // per client, a minute
	farBuckets   = 3
	farHammers   = 12 // goroutines of the hammering client
	farPolite    = 6  // polite clients, a goroutine each
	farCalls     = 40 // each goroutine's calls
	farFlushes   = 12 // Flush or FlushAll, in turn
	farFills     = 6  // resources filled without a flush, and hammered alone
	farHammerW   = 3
	farHammerKey = "h"
)

// farEvent is one call or flush, between two numbers of the counter.
type farEvent struct {
	start, end int64
	client     string // "" for FlushAll
	flush      bool
	weight     int
	admitted   bool
}

// farLog gathers the events of a run.
type farLog struct {
	mu     sync.Mutex
	seq    int64
	events []farEvent
	errs   []error
}

// next takes a number of the counter.
func (l *farLog) next() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	return l.seq
}

func (l *farLog) call(b *Bucket, resource, client string, n int) {
	start := l.next()
	res, err := allowBounded(b, 10*time.Second, resource, client, n)
	end := l.next()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, err)
		return
	}
	l.events = append(l.events, farEvent{start: start, end: end, client: client, weight: n, admitted: res.Allowed})
}

func (l *farLog) flush(b *Bucket, resource, client string) {
	start := l.next()
	var err error
	if client == "" {
		err = b.FlushAll(context.Background(), resource)
	} else {
		err = b.Flush(context.Background(), resource, client)
	}
	end := l.next()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("flush %q: %w", client, err))
	}
	l.events = append(l.events, farEvent{start: start, end: end, client: client, flush: true})
}

// admitted is the weight admitted in all.
func (l *farLog) admitted() int {
	n := 0
	for _, e := range l.events {
		if e.admitted {
			n += e.weight
		}
	}
	return n
}

// check proves the limits on every span between two flushes: the calls
// that started after a flush returned and returned before the next flush
// started were counted together, by every rule, with nothing erased.
func (l *farLog) check(t *testing.T) {
	t.Helper()
	var bounds []int64 // flush starts and ends, in order: spans lie between an end and the next start
	bounds = append(bounds, 0)
	for _, e := range l.events {
		if e.flush {
			bounds = append(bounds, e.start, e.end)
		}
	}
	bounds = append(bounds, l.next())
	slices.Sort(bounds)
	for i := 0; i+1 < len(bounds); i += 2 {
		from, to := bounds[i], bounds[i+1]
		total, per := 0, map[string]int{}
		for _, e := range l.events {
			if !e.flush && e.admitted && e.start > from && e.end < to {
				total += e.weight
				per[e.client] += e.weight
			}
		}
		if total > farResource {
			t.Errorf("between %d and %d: %d units admitted to the resource, limit %d", from, to, total, farResource)
		}
		for c, n := range per {
			if n > farClient {
				t.Errorf("between %d and %d: %d units admitted to client %s, limit %d", from, to, n, c, farClient)
			}
		}
	}
}

// farTxns counts the decisions sent without reading any oldest member
// (lean), and those that read some (full).
type farTxns struct {
	mu         sync.Mutex
	lean, full int
}

func (f *farTxns) counts() (lean, full int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lean, f.full
}

func (f *farTxns) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *farTxns) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (f *farTxns) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		writes, oldest := false, false
		for _, c := range cmds {
			args := c.Args()
			switch commandName(c) {
			case "pexpire": // a set the decision wrote to
				writes = true
			case "zrange":
				oldest = oldest || len(args) > 2 && fmt.Sprint(args[2]) == "0"
			}
		}
		f.mu.Lock()
		switch {
		case writes && oldest:
			f.full++
		case writes:
			f.lean++
		}
		f.mu.Unlock()
		return next(ctx, cmds)
	}
}

func TestSortedSetFarPathAdversary(t *testing.T) {
	eachOf(t, []Strategy{SortedSet}, func(t *testing.T, e *env) {
		e.needsRedis(t, "Buckets share their counts only in Redis")
		txns := &farTxns{}
		e.addHook(txns)
		rules := []Option{PerResource(Per(farResource, time.Minute)), PerClient(Per(farClient, time.Minute))}
		deciders := make([]*Bucket, farBuckets)
		for i := range deciders {
			deciders[i] = e.bucket(t, rules...)
		}
		ops := e.bucket(t, rules...)

		// A storm of flushes under load.
		storm := &farLog{}
		farLoad(storm, deciders, "storm", farPolite, func() {
			for i := range farFlushes {
				client := farHammerKey
				if i%2 == 1 {
					client = ""
				}
				storm.flush(ops, "storm", client)
				runtime.Gosched()
			}
		})
		if len(storm.errs) > 0 {
			t.Fatalf("%d errors, first: %v", len(storm.errs), storm.errs[0])
		}
		storm.check(t)

		// No flush: the load, then clients of their own fill what is left.
		for round := range farFills {
			farFill(t, e, deciders, ops, fmt.Sprintf("fill%d", round))
		}
		// The hammer alone, from every Bucket: its own rule decides.
		for round := range farFills {
			alone := &farLog{}
			farLoad(alone, deciders, fmt.Sprintf("alone%d", round), 0, func() {})
			alone.check(t)
			if n := alone.admitted(); n != farClient {
				t.Errorf("the hammer alone was admitted %d units, want exactly %d", n, farClient)
			}
		}
		lean, full := txns.counts()
		if lean == 0 {
			t.Errorf("no decision was sent lean (%d full): the fast path was not tried", full)
		}
		t.Logf("decisions sent lean: %d, full: %d", lean, full)
	})
}

// farFill runs the load on a fresh resource, with no flush, then fills it
// one unit at a time: it must admit exactly its limit in all, and count
// exactly what it admitted.
func farFill(t *testing.T, e *env, deciders []*Bucket, ops *Bucket, resource string) {
	t.Helper()
	fill := &farLog{}
	fill.flush(ops, resource, "")
	farLoad(fill, deciders, resource, farPolite, func() {})
	settle(e)
	for i := range farResource { // clients of their own: each may take 1
		fill.call(deciders[i%len(deciders)], resource, fmt.Sprintf("filler%d", i), 1)
	}
	if len(fill.errs) > 0 {
		t.Fatalf("%d errors, first: %v", len(fill.errs), fill.errs[0])
	}
	fill.check(t)
	if admitted := fill.admitted(); admitted != farResource {
		t.Errorf("%s admitted %d units in all, want exactly %d", resource, admitted, farResource)
	}
	settle(e)
	res, err := ops.Peek(context.Background(), resource, "someone")
	if err != nil {
		t.Fatal(err)
	}
	if res.Allowed || res.Rules[0].Used != farResource {
		t.Errorf("Peek of %s after the fill: %+v, want the resource's rule to count exactly %d", resource, res, farResource)
	}
}

// farLoad runs the hammer and polite clients on resource, through the
// deciders in turn, with during beside them; it returns when all are done.
func farLoad(l *farLog, deciders []*Bucket, resource string, polite int, during func()) {
	var wg sync.WaitGroup
	for g := range farHammers {
		wg.Go(func() {
			for range farCalls {
				l.call(deciders[g%len(deciders)], resource, farHammerKey, farHammerW)
			}
		})
	}
	for p := range polite {
		wg.Go(func() {
			for i := range farCalls {
				l.call(deciders[p%len(deciders)], resource, fmt.Sprintf("p%d", p), 1+i%2)
			}
		})
	}
	wg.Go(during)
	wg.Wait()
}

// settle waits until the take-backs still under way have run: in a
// synctest bubble, until every goroutine is blocked; on the real clock,
// for a while.
func settle(e *env) {
	if e.real {
		time.Sleep(300 * time.Millisecond)
		return
	}
	synctest.Wait()
}

// TestSortedSetFarDeniedDecidedAgain: a call this Bucket saw far from its
// limit, which another Bucket filled meanwhile, is denied with the Result
// a full read gives (RetryAfter counts from the oldest member, which the
// lean read did not fetch), in two round trips, and leaves nothing
// counted.
func TestSortedSetFarDeniedDecidedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, SortedSet)
		rule := PerClient(Per(10, time.Minute))
		seer, filler := e.bucket(t, rule), e.bucket(t, rule)
		mustAdmit(t, seer, "r", "c", 1) // seen: 1 of 10, far
		time.Sleep(10 * time.Second)
		mustAdmit(t, filler, "r", "c", 9) // full, unseen by seer
		time.Sleep(5 * time.Second)
		var res Result
		var err error
		trips := e.trips.count(func() { res, err = allowBounded(seer, time.Second, "r", "c", 1) })
		if err != nil {
			t.Fatal(err)
		}
		want := Result{Allowed: false, Remaining: 0, RetryAfter: 45 * time.Second, ResetAfter: 55 * time.Second}
		if res.Allowed != want.Allowed || res.Remaining != want.Remaining || res.RetryAfter != want.RetryAfter || res.ResetAfter != want.ResetAfter {
			t.Errorf("the far call after the fill: %+v, want %+v", res, want)
		}
		if trips != 2 {
			t.Errorf("%d round trips, want 2: the lean decision, then the full one", trips)
		}
		if used := usedNow(t, filler, "r", "c", 0); used != 10 {
			t.Errorf("the rule counts %d after the denial, want 10", used)
		}
	})
}
