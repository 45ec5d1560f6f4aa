// Package keys names the Redis keys of a Bucket. For prefix P, resource r
// and client c, with R and C their unpadded base64url encodings, and T the
// Bucket's tag (its longest window, and its precisions under Windows: see
// docs/strategies.md, "Key layout"):
//
//	P:T:{R}:lock                  Logs: the lock, when a rule is per-resource
//	P:T:{R}:lock:C                Logs: the lock, when every rule is per-client
//	P:T:{R}:log:C:<ms>:<n>:<uuid> Logs: calls of total weight n made at Redis time <ms>
//	P:T:{R}:zlog:W:L[:C]          SortedSet: the calls of a rule of window W ms and
//	                              limit L, the resource's or the client's
//	P:T:{R}:hash[@G][:C]:<g>.<e>  Windows: weight per interval of span g's epoch e
//	                              in generation G, the resource's or the client's
//	P:T:{R}:gen                   Windows: the generation, once FlushAll ran;
//	                              GCRA: set by every Flush and FlushAll, for Refund
//	P:T:{R}:fence:<id>            SortedSet, Windows: one transaction's marker
//	P:T:{R}:t:W.R.B[:C]           GCRA: a bucket draining R per W ms, of burst B (in
//	                              base 36), the resource's or the client's: its
//	                              TAT is the key's expiry
//
// The hash tag {R} keeps every key of a resource in one cluster slot, so
// that no lock, WATCH or MULTI/EXEC crosses slots. base64url has no ':',
// brace or glob metacharacter, so the tag ends where R ends, no two
// (resource, client) pairs share a key, and no MATCH pattern of one kind
// of key or client matches another ("log:", "lock", "zlog", "hash",
// "fence:", "gen" and "t:" differ before any '*').
package keys

import (
	"encoding/base64"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// Space names the keys of one resource.
type Space struct {
	base string // P:T:{R}:
}

// Of returns the keys of resource under prefix (P:T).
func Of(prefix, resource string) Space {
	return Space{base: name(2, prefix, ":{", resource, "}:")}
}

// Encode is how a resource or client name appears in a key.
func Encode(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// name joins parts, the one at index enc encoded (Encode), in one
// allocation: every call names its keys, and most names fit the room on
// the stack.
func name(enc int, parts ...string) string {
	var room [128]byte
	b := room[:0]
	for i, p := range parts {
		if i == enc {
			b = base64.RawURLEncoding.AppendEncode(b, []byte(p))
		} else {
			b = append(b, p...)
		}
	}
	return string(b)
}

// Slot is a key in the resource's slot, to find the node that owns it.
func (k Space) Slot() string { return k.base }

// ResourceLock is the lock of a Bucket with a per-resource rule.
func (k Space) ResourceLock() string { return k.base + "lock" }

// ClientLock is the lock of client, when every rule is per-client.
func (k Space) ClientLock(client string) string { return name(2, k.base, "lock:", client) }

// Logs is the prefix of every log of the resource.
func (k Space) Logs() string { return k.base + "log:" }

// ClientLogs is the prefix of the logs of one client of the resource.
func (k Space) ClientLogs(client string) string { return k.Logs() + Encode(client) + ":" }

// NewLog names the log of a call of weight n by client, admitted at Redis
// time at (ms).
func (k Space) NewLog(client string, at int64, n int) string {
	return k.ClientLogs(client) + strconv.FormatInt(at, 10) + ":" + strconv.Itoa(n) + ":" + uuid.NewString()
}

// A Log is what a log's name says: the client (as Encode writes it), the
// Redis time of the call (ms) and its weight.
type Log struct {
	Client string
	At     int64
	Weight int
}

// ParseLog reads the name of a log found under logs (a resource's Logs).
// A key that does not have the shape of a log is not one of ours: ok is
// false.
func ParseLog(key, logs string) (l Log, ok bool) {
	rest, ok := strings.CutPrefix(key, logs)
	if !ok {
		return Log{}, false
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 4 {
		return Log{}, false
	}
	at, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return Log{}, false
	}
	weight, err := strconv.Atoi(parts[2])
	if err != nil || weight <= 0 {
		return Log{}, false
	}
	return Log{Client: parts[0], At: at, Weight: weight}, true
}

// SortedSet is the prefix of the resource's sorted sets. (Versions that
// capped each set at its limit named them "zset": a process of such a
// version, sharing a set with one that writes before it judges, could
// remove calls that the other admitted, so the two never share one.)
func (k Space) SortedSet() string { return k.base + "zlog" }

// Client names client's key among the keys whose names start with scope
// (a per-resource key): scope, ':' and the client's encoding.
func Client(scope, client string) string { return name(2, scope, ":", client) }

// Hashes is the prefix of every Windows hash of the resource.
func (k Space) Hashes() string { return k.base + "hash" }

// Hash is the resource's Windows hash in generation gen ("" until the
// first FlushAll).
func (k Space) Hash(gen string) string {
	if gen == "" {
		return k.Hashes()
	}
	return k.Hashes() + "@" + gen
}

// ClientHash is what client's Windows hashes in generation gen start
// with.
func (k Space) ClientHash(gen, client string) string {
	if gen == "" {
		return name(2, k.base, "hash:", client)
	}
	return name(4, k.base, "hash@", gen, ":", client)
}

// Epoch names the hash of span g's epoch e among the hashes of one scope,
// whose names start with scope (Hash, or ClientHash). base64url has no
// '.', so no client's scope is another scope's epoch.
func Epoch(scope string, g int, e int64) string {
	var room [128]byte
	b := append(append(room[:0], scope...), ':')
	b = append(strconv.AppendInt(b, int64(g), 10), '.')
	return string(strconv.AppendInt(b, e, 10))
}

// GCRA is the prefix of every TAT of the resource (GCRA).
func (k Space) GCRA() string { return k.base + "t:" }

// Generation holds the generation of the resource's Windows hashes, or
// of its GCRA buckets (which a Refund checks).
func (k Space) Generation() string { return k.base + "gen" }

// MatchPrefix returns the MATCH pattern of every key that starts with
// prefix, taken literally: Redis glob metacharacters are escaped.
func MatchPrefix(prefix string) string {
	var b strings.Builder
	b.Grow(len(prefix) + 2)
	for i := 0; i < len(prefix); i++ {
		switch c := prefix[i]; c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('*')
	return b.String()
}

// Fence names the marker of one transaction, which tells whether it ran
// after its reply was lost.
func (k Space) Fence(id string) string { return k.base + "fence:" + id }
