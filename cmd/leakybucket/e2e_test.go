package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// The end-to-end tests run on the real Redis at $LEAKYBUCKET_REDIS_ADDR
// (scripts/test.sh starts one, whose default user is denied scripting),
// in database 2, so that they never meet the leakybucket package's tests
// (database 1); without it, on miniredis. Each test has a prefix of its
// own and deletes its keys.
const redisAddrVar = "LEAKYBUCKET_REDIS_ADDR"

// testRedis is a Redis database for one test.
type testRedis struct {
	url    string        // for -redis
	rdb    *redis.Client // the test's own client of the same database
	prefix string        // the test's own: every key it makes starts with it
}

func newTestRedis(t *testing.T) *testRedis {
	t.Helper()
	addr := os.Getenv(redisAddrVar)
	if addr == "" {
		addr = miniredis.RunT(t).Addr()
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := &testRedis{
		url:    "redis://" + addr + "/2",
		rdb:    redis.NewClient(&redis.Options{Addr: addr, DB: 2}),
		prefix: "leakybucket-cmd-test-" + hex.EncodeToString(b[:]),
	}
	t.Cleanup(func() {
		if keys := r.keys(t); len(keys) > 0 {
			r.rdb.Del(context.Background(), keys...)
		}
		r.rdb.Close()
	})
	return r
}

// keys returns the keys of the test's prefix.
func (r *testRedis) keys(t *testing.T) []string {
	t.Helper()
	keys, err := r.rdb.Keys(context.Background(), r.prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

// peekRows runs peek with args and returns its table by rule name (as
// "per-client 10 per 1m": used/limit, remaining, retry after, reset after)
// and its "would allow" line.
func peekRows(t *testing.T, args ...string) (map[string][]string, string) {
	t.Helper()
	code, stdout, stderr := cli(args...)
	if code != exitOK || stderr != "" {
		t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "rule ") {
		t.Fatalf("%q: not a table:\n%s", args, stdout)
	}
	rows := map[string][]string{}
	for _, line := range lines[1 : len(lines)-1] {
		f := strings.Fields(line)
		rows[strings.Join(f[:4], " ")] = f[4:]
	}
	return rows, lines[len(lines)-1]
}

// e2e is a Bucket of one strategy on a test's database, and the command's
// global flags for the same Bucket.
type e2e struct {
	t      *testing.T
	r      *testRedis
	bucket *leakybucket.Bucket
	global []string
}

// newE2E returns the e2e of a strategy, given as -strategy and as made in
// Go, with the rules 100/30m per resource and 10/1m per client.
func newE2E(t *testing.T, flag string, strategy leakybucket.Strategy) *e2e {
	r := newTestRedis(t)
	b, err := leakybucket.New(r.rdb, leakybucket.WithPrefix(r.prefix), leakybucket.WithStrategy(strategy),
		leakybucket.PerResource(leakybucket.Per(100, 30*time.Minute)), leakybucket.PerClient(leakybucket.PerMinute(10)))
	if err != nil {
		t.Fatal(err)
	}
	global := []string{"-redis", r.url, "-prefix", r.prefix, "-strategy", flag, "-resource-limit", "100/30m", "-client-limit", "10/1m"}
	return &e2e{t: t, r: r, bucket: b, global: global}
}

// allow admits times calls of client at resource r.
func (e *e2e) allow(client string, times int) {
	e.t.Helper()
	for range times {
		if res, err := e.bucket.Allow(context.Background(), "r", client); err != nil || !res.Allowed {
			e.t.Fatalf("Allow(r, %s) = %+v, %v", client, res, err)
		}
	}
}

// args returns the command's arguments: the global flags, then these.
func (e *e2e) args(args ...string) []string { return append(slices.Clip(e.global), args...) }

// mustRun runs the command, which must succeed.
func (e *e2e) mustRun(args ...string) {
	e.t.Helper()
	if code, _, stderr := cli(e.args(args...)...); code != exitOK {
		e.t.Fatalf("%q: exit %d, stderr %q", args, code, stderr)
	}
}

// peek checks what peek prints for client at resource r: each rule's
// used/limit and whether it would allow. It returns the per-client row.
func (e *e2e) peek(client, resourceUsed, clientUsed, allow string) []string {
	e.t.Helper()
	rows, last := peekRows(e.t, e.args("peek", "-resource", "r", "-client", client)...)
	res, cl := rows["per-resource 100 per 30m"], rows["per-client 10 per 1m"]
	if len(res) != 4 || len(cl) != 4 || res[0] != resourceUsed || cl[0] != clientUsed || last != "would allow: "+allow {
		e.t.Fatalf("peek %s: per-resource %q, per-client %q, %q; want used %s and %s, would allow: %s", client, res, cl, last, resourceUsed, clientUsed, allow)
	}
	return cl
}

// TestEndToEnd makes decisions with the library, then checks what peek,
// flush and flush-all show and do, for every strategy.
func TestEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		flag     string
		strategy leakybucket.Strategy
	}{
		{"logs", leakybucket.Logs},
		{"sortedset", leakybucket.SortedSet},
		{"windows:1s", leakybucket.Windows(time.Second)},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			t.Parallel()
			e := newE2E(t, tc.flag, tc.strategy)
			e.allow("alice", 10)
			e.allow("bob", 2)
			if cl := e.peek("alice", "12/100", "10/10", "false"); cl[1] != "0" || cl[2] == "0s" {
				t.Errorf("peek alice: a full rule has remaining %s and retry after %s", cl[1], cl[2])
			}
			e.peek("bob", "12/100", "2/10", "true")
			if cl := e.peek("carol", "12/100", "0/10", "true"); !slices.Equal(cl[1:], []string{"10", "0s", "0s"}) {
				t.Errorf("peek carol, who made no call: per-client %q, want 10 remaining, 0s, 0s", cl)
			}

			e.flushNeedsResource()
			e.peek("alice", "12/100", "10/10", "false")

			e.mustRun("flush", "-resource", "r", "-client", "alice")
			e.peek("alice", "2/100", "0/10", "true")
			e.peek("bob", "2/100", "2/10", "true")

			e.mustRun("flush-all", "-resource", "r")
			e.peek("alice", "0/100", "0/10", "true")
			e.peek("bob", "0/100", "0/10", "true")
		})
	}
}

// flushNeedsResource checks that flush without -resource exits 2 and
// writes nothing: the same counts' keys, and no key that was not there.
// (Windows' fences, which mark a transaction for a few hundred ms, may
// expire meanwhile on a loaded host.)
func (e *e2e) flushNeedsResource() {
	e.t.Helper()
	before := e.r.keys(e.t)
	if code, _, stderr := cli(e.args("flush", "-client", "alice")...); code != exitUsage || !strings.Contains(stderr, "-resource is required") {
		e.t.Errorf("flush without -resource: exit %d, stderr %q", code, stderr)
	}
	after := e.r.keys(e.t)
	added := slices.DeleteFunc(slices.Clone(after), func(k string) bool { return slices.Contains(before, k) })
	if len(added) > 0 || !slices.Equal(countKeys(after), countKeys(before)) {
		e.t.Errorf("flush without -resource changed the keys from %q to %q", before, after)
	}
}

// countKeys leaves out of keys the fences, which expire on their own.
func countKeys(keys []string) []string {
	return slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return strings.Contains(k, "}:fence:") })
}

// TestBinary builds the command and runs it, as an operator would.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build with")
	}
	bin := filepath.Join(t.TempDir(), "leakybucket")
	if out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "-h").Output()
	if err != nil || !strings.Contains(string(out), "Subcommands:") {
		t.Errorf("leakybucket -h: %v\n%s", err, out)
	}
	err = exec.Command(bin, "-client-limit", "1/s", "flush").Run()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != exitUsage {
		t.Errorf("leakybucket flush without -resource: %v, want exit status %d", err, exitUsage)
	}
}

// TestEndToEndPrecision checks peek on a Bucket of fixed and precise
// windows: the rule's precision in its name, and when each frees.
func TestEndToEndPrecision(t *testing.T) {
	r := newTestRedis(t)
	b, err := leakybucket.New(r.rdb, leakybucket.WithPrefix(r.prefix), leakybucket.WithStrategy(leakybucket.FixedWindows),
		leakybucket.PerResource(leakybucket.Per(100, 30*time.Minute)), leakybucket.PerClient(leakybucket.PerMinute(10).WithPrecision(10*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, r: r, bucket: b, global: []string{"-redis", r.url, "-prefix", r.prefix, "-strategy", "windows:fixed", "-resource-limit", "100/30m", "-client-limit", "10/1m@10s"}}
	before := time.Now()
	e.allow("alice", 10)
	rows, last := peekRows(t, e.args("peek", "-resource", "r", "-client", "alice")...)
	res, cl := rows["per-resource 100 per 30m"], rows["per-client 10 per 1m"]
	if len(res) != 4 || len(cl) != 6 || res[0] != "10/100" || !slices.Equal(cl[:4], []string{"(precision", "10s)", "10/10", "0"}) || last != "would allow: false" {
		t.Fatalf("peek alice: per-resource %q, per-client %q, %q", res, cl, last)
	}
	// The fixed window resets at the next half hour (a multiple of it
	// since the Unix epoch, and so since the zero time); alice's calls
	// leave a minute after the end of their 10s interval.
	took := time.Since(before) + time.Second
	boundary := before.Truncate(30 * time.Minute).Add(30 * time.Minute)
	within(t, "per-resource reset after", res[3], boundary.Sub(before)-took, boundary.Sub(before)+time.Second)
	within(t, "per-client retry after", cl[4], time.Minute-took, 70*time.Second)
	e.mustRun("flush", "-resource", "r", "-client", "alice")
	rows, last = peekRows(t, e.args("peek", "-resource", "r", "-client", "alice")...)
	if res, cl := rows["per-resource 100 per 30m"], rows["per-client 10 per 1m"]; res[0] != "0/100" || cl[2] != "0/10" || last != "would allow: true" {
		t.Errorf("after flush: per-resource %q, per-client %q, %q", res, cl, last)
	}
}

// within checks that the duration peek printed as what is from lo to hi.
func within(t *testing.T, what, printed string, lo, hi time.Duration) {
	t.Helper()
	if d, err := time.ParseDuration(printed); err != nil || d < lo || d > hi {
		t.Errorf("%s %q, want from %v to %v", what, printed, lo, hi)
	}
}
