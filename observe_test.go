package leakybucket

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// decisions collects what an observer hears.
type decisions struct {
	mu  sync.Mutex
	all []Decision
}

func (ds *decisions) observe(_ context.Context, d Decision) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ds.all = append(ds.all, d)
}

// last returns the only Decision heard since the previous call of last.
func (ds *decisions) last(t *testing.T) Decision {
	t.Helper()
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if len(ds.all) != 1 {
		t.Fatalf("the observer heard %d decisions, want 1: %+v", len(ds.all), ds.all)
	}
	d := ds.all[0]
	ds.all = nil
	return d
}

// slowRedis makes every command and pipeline take delay, on the bubble's
// fake clock, so that a call's latency is known exactly.
type slowRedis struct{ delay time.Duration }

func (s slowRedis) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s slowRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(s.delay)
		return next(ctx, cmd)
	}
}

func (s slowRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		time.Sleep(s.delay)
		return next(ctx, cmds)
	}
}

// Every AllowN is reported once, after it decided: allowed, denied by one
// rule, denied by both (DeniedBy lists both), with the call's arguments
// and its latency from start to return, exact on the bubble's clock.
func TestObserverAllowAndDeny(t *testing.T) {
	perResource := Rule{Limit: Per(2, time.Minute)}
	perClient := Rule{PerClient: true, Limit: Per(1, time.Minute)}
	steps := []struct {
		client   string
		allowed  bool
		deniedBy []Rule
	}{
		{"a", true, nil},
		{"a", false, []Rule{perClient}},
		{"b", true, nil},
		{"c", false, []Rule{perResource}},
		{"a", false, []Rule{perResource, perClient}},
	}
	for _, s := range strategies {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newMiniEnv(t, s)
				e.rdb.AddHook(slowRedis{delay: 3 * time.Millisecond})
				var heard decisions
				b := e.bucket(t, PerResource(perResource.Limit), PerClient(perClient.Limit), WithObserver(heard.observe))
				for i, step := range steps {
					start := time.Now()
					res, err := b.AllowN(context.Background(), "r", step.client, 1)
					took := time.Since(start)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					d := heard.last(t)
					want := Decision{Op: opAllow, Resource: "r", Client: step.client, N: 1, Allowed: step.allowed, DeniedBy: step.deniedBy, Latency: took}
					if !equalDecisions(d, want) || res.Allowed != d.Allowed || !slices.Equal(res.DeniedBy, d.DeniedBy) {
						t.Errorf("step %d: observed %+v, want %+v (the Result: %+v)", i, d, want, res)
					}
					if took < 3*time.Millisecond {
						t.Errorf("step %d: the call took %v, less than one slowed round trip", i, took)
					}
				}
			})
		})
	}
}

func equalDecisions(a, b Decision) bool {
	return a.Op == b.Op && a.Resource == b.Resource && a.Client == b.Client && a.N == b.N &&
		a.Allowed == b.Allowed && slices.Equal(a.DeniedBy, b.DeniedBy) && a.Latency == b.Latency &&
		errors.Is(a.Err, b.Err) && (a.Err == nil) == (b.Err == nil)
}

// The observer gets copies: writing to its DeniedBy changes no Result.
func TestObserverCannotChangeResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		rule := Rule{PerClient: true, Limit: Per(1, time.Minute)}
		b := e.bucket(t, PerClient(rule.Limit), WithObserver(func(_ context.Context, d Decision) {
			for i := range d.DeniedBy {
				d.DeniedBy[i] = Rule{}
			}
			d.Allowed = true
		}))
		ctx := context.Background()
		if _, err := b.Allow(ctx, "r", "c"); err != nil {
			t.Fatal(err)
		}
		res, err := b.Allow(ctx, "r", "c")
		if err != nil || res.Allowed || !slices.Equal(res.DeniedBy, []Rule{rule}) {
			t.Errorf("Allow = %+v, %v; want denied by %v whatever the observer does", res, err, rule)
		}
	})
}

// Bad input is reported with its error; nothing was
// sent, and the observer hears it all the same.
func TestObserverBadInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		var heard decisions
		b := e.bucket(t, PerClient(Per(5, time.Minute)), WithObserver(heard.observe))
		ctx := context.Background()
		for _, c := range []struct {
			resource, client string
			n                int
			want             error
		}{
			{"", "c", 1, ErrEmptyResource},
			{"r", "", 1, ErrEmptyClient},
			{"r", "c", 0, ErrInvalidWeight},
			// n = 6 above the rule's 5 is a denial now, not bad input:
			// TestObserverNever.
		} {
			_, err := b.AllowN(ctx, c.resource, c.client, c.n)
			d := heard.last(t)
			want := Decision{Op: opAllow, Resource: c.resource, Client: c.client, N: c.n, Err: c.want}
			if !errors.Is(err, c.want) || d.Err != err || !equalDecisions(d, want) {
				t.Errorf("AllowN(%q, %q, %d) = %v; observed %+v, want %+v", c.resource, c.client, c.n, err, d, want)
			}
		}
	})
}

// A Redis that refuses connections is reported as ErrUnavailable, with
// the very error the caller got.
func TestObserverUnavailable(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: refusingAddr(t), MaxRetries: -1})
	defer rdb.Close()
	var heard decisions
	b, err := New(rdb, PerResource(Per(1, time.Minute)), WithObserver(heard.observe))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	checkUnavailable(t, b, &heard)
	err = b.Flush(ctx, "r", "c")
	if d := heard.last(t); d.Op != opFlush || !errors.Is(d.Err, ErrUnavailable) || d.Err != err {
		t.Errorf("Flush on a refusing port: %v, observed as %+v", err, d)
	}
}

// checkUnavailable checks what the observer hears of an Allow on a Redis
// that refuses connections.
func checkUnavailable(t *testing.T, b *Bucket, heard *decisions) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := b.Allow(ctx, "r", "")
	took := time.Since(start)
	d := heard.last(t)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Allow on a refusing port: %v, want ErrUnavailable (connection refused)", err)
	}
	want := Decision{Op: opAllow, Resource: "r", N: 1, Latency: d.Latency, Err: err}
	if !equalDecisions(d, want) || d.Err != err || d.Latency <= 0 || d.Latency > took {
		t.Errorf("observed %+v, want %+v, with a latency within the %v the call took", d, want, took)
	}
}

// Peek, Flush and FlushAll are reported too, each with its Op.
func TestObserverOtherMethods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, SortedSet)
		var heard decisions
		rule := Rule{Limit: Per(1, time.Minute)}
		b := e.bucket(t, PerResource(rule.Limit), WithObserver(heard.observe))
		ctx := context.Background()
		if _, err := b.Allow(ctx, "r", "c"); err != nil {
			t.Fatal(err)
		}
		heard.last(t)
		if _, err := b.PeekN(ctx, "r", "c", 1); err != nil {
			t.Fatal(err)
		}
		if d := heard.last(t); !equalDecisions(d, Decision{Op: opPeek, Resource: "r", Client: "c", N: 1, DeniedBy: []Rule{rule}}) {
			t.Errorf("PeekN observed as %+v", d)
		}
		if err := b.Flush(ctx, "r", "c"); err != nil {
			t.Fatal(err)
		}
		if d := heard.last(t); !equalDecisions(d, Decision{Op: opFlush, Resource: "r", Client: "c"}) {
			t.Errorf("Flush observed as %+v", d)
		}
		if err := b.FlushAll(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if d := heard.last(t); !equalDecisions(d, Decision{Op: opFlushAll, Resource: "r"}) {
			t.Errorf("FlushAll observed as %+v", d)
		}
	})
}

// A panicking observer reaches the caller, after the call was decided and
// recorded; the Bucket goes on working.
func TestObserverPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newMiniEnv(t, Logs)
		calls := 0
		b := e.bucket(t, PerClient(Per(2, time.Minute)), WithObserver(func(context.Context, Decision) {
			calls++
			if calls == 1 {
				panic("observer bug")
			}
		}))
		ctx := context.Background()
		func() {
			defer func() {
				if r := recover(); r != "observer bug" {
					t.Errorf("recovered %v, want the observer's panic", r)
				}
			}()
			_, _ = b.Allow(ctx, "r", "c")
		}()
		res, err := b.Allow(ctx, "r", "c")
		if err != nil || !res.Allowed || res.Remaining != 0 || calls != 2 {
			t.Errorf("after the panic: Allow = %+v, %v, %d observed; want allowed, the panicking call counted", res, err, calls)
		}
	})
}

// OpenTelemetry stays in its own module (otelmetrics/): the core's users
// never download it.
func TestCoreNeedsNoOpenTelemetry(t *testing.T) {
	t.Parallel()
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mod), "go.opentelemetry.io") {
		t.Errorf("the core's go.mod requires OpenTelemetry:\n%s", mod)
	}
}
