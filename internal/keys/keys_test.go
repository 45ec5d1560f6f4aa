package keys

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"

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
	k1, k2 := Of(prefix, r1), Of(prefix, r2)
	log1 := k1.NewLog(c1, 1_700_000_000_123, 7)
	// An empty resource is refused before any key is made: it needs no tag.
	if got := hashTag(log1); r1 != "" && (got != Encode(r1) || hashTag(k1.ResourceLock()) != got || hashTag(k1.ClientLock(c1)) != got) {
		t.Fatalf("keys of resource %q hash on %q, want %q", r1, got, Encode(r1))
	}
	if m := globMatch(t, MatchPrefix(k2.Logs()), log1); m != (r1 == r2) {
		t.Fatalf("resource %q's pattern matches a log of %q: %v", r2, r1, m)
	}
	if m := globMatch(t, MatchPrefix(k2.ClientLogs(c2)), log1); m != (r1 == r2 && c1 == c2) {
		t.Fatalf("the pattern of (%q, %q) matches a log of (%q, %q): %v", r2, c2, r1, c1, m)
	}
	for _, lock := range []string{k1.ResourceLock(), k1.ClientLock(c1)} {
		if globMatch(t, MatchPrefix(k2.Logs()), lock) || globMatch(t, MatchPrefix(k2.ClientLogs(c2)), lock) {
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
	for _, prefix := range []string{"leakybucket", `[p]*\`} {
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
			m.Set(Of("p*", r).NewLog(c, 1, 1), "")
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	for _, r := range trickyNames {
		for _, c := range trickyNames[:8] {
			pattern := MatchPrefix(Of("p*", r).ClientLogs(c))
			found, _, err := rdb.Scan(context.Background(), 0, pattern, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(found) != 1 || !globMatch(t, pattern, found[0]) {
				t.Errorf("SCAN MATCH %q = %q, want the one log of (%q, %q)", pattern, found, r, c)
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

// ParseLog reads back what NewLog wrote, whatever the names hold.
func TestParseLog(t *testing.T) {
	t.Parallel()
	names := []string{"", "a", "*", "?", "[a]", `\`, ":", "a:b", "{}", "log:", "\x00", "\xff"}
	for _, r := range names {
		for _, c := range names {
			k := Of("p", r)
			log := k.NewLog(c, 1_700_000_000_123, 7)
			l, ok := ParseLog(log, k.Logs())
			if !ok || l != (Log{Client: Encode(c), At: 1_700_000_000_123, Weight: 7}) {
				t.Fatalf("ParseLog(%q) = %+v, %v", log, l, ok)
			}
		}
	}
}

// The names are the layout's, byte for byte, however they are built: two
// versions of a rolling deploy must name the same keys. Names longer than
// the builders' room on the stack included.
func TestNamesAreTheLayouts(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("name é/{}:*", 20)
	for _, resource := range append([]string{"", "r", long}, trickyNames...) {
		for _, client := range []string{"", "c", long, "x:y{z}"} {
			ks := Of("p:60000", resource)
			base := "p:60000:{" + Encode(resource) + "}:"
			for _, c := range [][2]string{
				{ks.Slot(), base},
				{ks.ClientLock(client), base + "lock:" + Encode(client)},
				{ks.ClientHash("", client), base + "hash:" + Encode(client)},
				{ks.ClientHash("7", client), base + "hash@7:" + Encode(client)},
				{Client(ks.SortedSet()+":10:5", client), base + "zlog:10:5:" + Encode(client)},
				{Epoch(ks.ClientHash("", client), 1, 123456789), base + "hash:" + Encode(client) + ":1.123456789"},
			} {
				if c[0] != c[1] {
					t.Errorf("resource %q, client %q: got %q, want %q", resource, client, c[0], c[1])
				}
			}
		}
	}
}
