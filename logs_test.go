package leakybucket

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// globMatch is Redis's glob matching (stringmatchlen in util.c) for the
// patterns this package writes: literals, backslash escapes and '*'. A
// character class would be a bug in matchPrefix, which escapes '['.
func globMatch(t testing.TB, pattern, s string) bool {
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for i := 0; i <= len(s); i++ {
				if globMatch(t, pattern[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if s == "" {
				return false
			}
		case '[':
			t.Fatalf("pattern %q has an unescaped '['", pattern)
		case '\\':
			if len(pattern) > 1 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if s == "" || s[0] != pattern[0] {
				return false
			}
		}
		pattern, s = pattern[1:], s[1:]
	}
	return s == ""
}

// hashTag returns what Redis Cluster hashes of key: the text between the
// first '{' and the next '}', if not empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// checkKeys checks the key layout for two (resource, client) pairs: a log
// is matched by its own pair's patterns only, never by another pair's, and
// no lock is ever matched by a log pattern.
func checkKeys(t testing.TB, prefix, r1, c1, r2, c2 string) {
	k1, k2 := resourceKeys(prefix, r1), resourceKeys(prefix, r2)
	log1 := k1.newLog(c1, 1_700_000_000_123, 7)

	e, ok := parseLog(log1, k1.logs())
	if !ok || e != (logEntry{id: log1, client: encode(c1), at: 1_700_000_000_123, weight: 7}) {
		t.Fatalf("parseLog(%q) = %+v, %v", log1, e, ok)
	}
	// An empty resource is refused before any key is made: it needs no tag.
	if got := hashTag(log1); r1 != "" && (got != encode(r1) || hashTag(k1.resourceLock()) != got || hashTag(k1.clientLock(c1)) != got) {
		t.Fatalf("keys of resource %q hash on %q, want %q", r1, got, encode(r1))
	}
	if m := globMatch(t, matchPrefix(k2.logs()), log1); m != (r1 == r2) {
		t.Fatalf("resource %q's pattern matches a log of %q: %v", r2, r1, m)
	}
	if m := globMatch(t, matchPrefix(k2.clientLogs(c2)), log1); m != (r1 == r2 && c1 == c2) {
		t.Fatalf("the pattern of (%q, %q) matches a log of (%q, %q): %v", r2, c2, r1, c1, m)
	}
	for _, lock := range []string{k1.resourceLock(), k1.clientLock(c1)} {
		if globMatch(t, matchPrefix(k2.logs()), lock) || globMatch(t, matchPrefix(k2.clientLogs(c2)), lock) {
			t.Fatalf("lock %q matches a log pattern of (%q, %q)", lock, r2, c2)
		}
	}
}

// Adversarial names: glob metacharacters, the separator, braces, the key
// layout's own words, empty strings and bytes that are not UTF-8.
var trickyNames = []string{
	"", "a", "b", "ab", "*", "?", "[", "]", "[a]", `\`, `\*`, ":", "a:b", "::",
	"{", "}", "{}", "{a}", "}{", "log", "lock", "log:", "a:log:b", "é", "\x00", "\xff", "a*b?",
}

func TestKeyEncodingProperty(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{DefaultPrefix, `[p]*\`} {
		for _, r1 := range trickyNames {
			for _, c1 := range trickyNames {
				for _, r2 := range trickyNames[:10] {
					for _, c2 := range trickyNames[:10] {
						checkKeys(t, prefix, r1, c1, r2, c2)
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "ab:*?[]\\{}"
	random := func() string {
		b := make([]byte, rng.IntN(6))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	for range 5000 {
		r, c := random(), random()
		checkKeys(t, "p", r, c, r, random())
		checkKeys(t, "p", r, c, random(), c)
	}
}

// The matcher above agrees with a real implementation of Redis globs.
func TestGlobMatchAgreesWithMiniredis(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	for _, r := range trickyNames {
		for _, c := range trickyNames {
			m.Set(resourceKeys("p*", r).newLog(c, 1, 1), "")
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	for _, r := range trickyNames {
		for _, c := range trickyNames[:8] {
			pattern := matchPrefix(resourceKeys("p*", r).clientLogs(c))
			keys, _, err := rdb.Scan(context.Background(), 0, pattern, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) != 1 || !globMatch(t, pattern, keys[0]) {
				t.Errorf("SCAN MATCH %q = %q, want the one log of (%q, %q)", pattern, keys, r, c)
			}
		}
	}
}

func FuzzKeys(f *testing.F) {
	for _, s := range trickyNames {
		f.Add(s, "a", s, "b")
		f.Add("r", s, "r", s+"x")
	}
	f.Fuzz(func(t *testing.T, r1, c1, r2, c2 string) {
		checkKeys(t, "p", r1, c1, r2, c2)
		checkKeys(t, "p", r2, c2, r1, c1)
	})
}

// Whatever the input, AllowN answers or returns an error; it never panics,
// and with an error it writes nothing.
func FuzzAllowInput(f *testing.F) {
	f.Add("r", "a", 1)
	f.Add("", "a", 1)
	f.Add("r", "", 1)
	f.Add("{r}", "*", 3)
	f.Add("r", "a", 0)
	f.Add("r", "a", -1)
	f.Add("r", "a", 1<<62)
	m := miniredis.RunT(f)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	f.Cleanup(func() { rdb.Close() })
	b, err := New(rdb, PerResource(Per(10, time.Minute)), PerClient(Per(3, time.Minute)))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, resource, client string, n int) {
		m.FlushAll()
		res, err := b.AllowN(context.Background(), resource, client, n)
		valid := resource != "" && client != "" && n >= 1 && n <= 3
		if (err == nil) != valid {
			t.Fatalf("AllowN(%q, %q, %d) error = %v, want error: %v", resource, client, n, err, !valid)
		}
		if !valid {
			if keys := m.Keys(); len(keys) != 0 {
				t.Fatalf("AllowN(%q, %q, %d) failed yet wrote %q", resource, client, n, keys)
			}
			return
		}
		keys := m.Keys()
		if !res.Allowed || res.Remaining != 3-n || len(keys) != 1 {
			t.Fatalf("AllowN(%q, %q, %d) = %+v with keys %q, want admitted, one log", resource, client, n, res, keys)
		}
		if e, ok := parseLog(keys[0], b.keysOf(resource).logs()); !ok || e.client != encode(client) || e.weight != n {
			t.Fatalf("log %q does not name (%q, %q, %d)", keys[0], resource, client, n)
		}
	})
}

// duplicateScans makes every SCAN page return each key twice, as SCAN may.
type duplicateScans struct{}

func (duplicateScans) DialHook(next redis.DialHook) redis.DialHook { return next }

func (duplicateScans) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (duplicateScans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if scan, ok := cmd.(*redis.ScanCmd); ok {
				keys, cursor := scan.Val()
				scan.SetVal(append(keys, keys...), cursor)
			}
		}
		return err
	}
}

func TestScanDuplicatesCountOnce(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		e.needsRedis(t, "SCAN")
		e.addHook(duplicateScans{})
		b := e.bucket(t, PerResource(Per(4, time.Minute)))
		deny := []Rule{{ScopeResource, Per(4, time.Minute)}}
		e.run(t, b, "r", []step{
			{0, "a", 2, false, want{true, 2, 0, time.Minute, nil}},
			{0, "b", 1, false, want{true, 1, 0, time.Minute, nil}},
			{0, "c", 1, true, want{true, 0, 0, time.Minute, nil}},
			{0, "c", 2, false, want{false, 1, time.Minute, time.Minute, deny}},
		})
	})
}

// SCAN paging, on the real Redis only (miniredis ignores COUNT): more logs
// than COUNT among thousands of unrelated keys are counted exactly.
//
// A decision here walks the whole shared database 10 keys a page, hundreds
// of round trips under its lock, which a loaded machine can stretch past
// the 2s default lock TTL: the lock TTL is not what this tests, so it is a
// minute.
func TestScanPaging(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, Logs)
	e.fillUnrelated(t, 3000)
	ctx := context.Background()
	const limit = 40
	b := e.bucket(t, WithScanCount(10), WithLockTTL(time.Minute), PerResource(Per(limit, time.Minute)), PerClient(Per(limit, time.Minute)))
	for i := range limit - 1 {
		if res, err := b.Allow(ctx, "r", "a"); err != nil || !res.Allowed || res.Remaining != limit-1-i {
			t.Fatalf("Allow #%d = %+v, %v; want admitted with %d left", i+1, res, err, limit-1-i)
		}
	}
	var res Result
	var err error
	if trips := e.trips.count(func() { res, err = b.Allow(ctx, "r", "a") }); trips < 100 {
		t.Errorf("a decision with COUNT 10 over 3000+ keys took %d round trips; SCAN did not page", trips)
	}
	if err != nil || !res.Allowed || res.Remaining != 0 {
		t.Fatalf("Allow #%d = %+v, %v; want admitted with 0 left", limit, res, err)
	}
	for _, client := range []string{"a", "b"} {
		if res, err := b.Allow(ctx, "r", client); err != nil || res.Allowed {
			t.Errorf("Allow(%s) past the limit = %+v, %v; want denied", client, res, err)
		}
	}
	if err := b.FlushAll(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Peek(ctx, "r", "a"); err != nil || res.Remaining != limit-1 {
		t.Errorf("Peek after FlushAll over many pages = %+v, %v; want %d left", res, err, limit-1)
	}
}
