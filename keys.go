package leakybucket

import (
	"encoding/base64"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// Key layout. For prefix P, resource r and client c, with R and C their
// unpadded base64url encodings, and T the Bucket's tag (w<longest window in
// ms>, and p<precision in ms> under Windows: w60000, w3600000p60000; with
// several precisions or fixed windows, one such part per lane, f<window>
// for a fixed one, see layout.tag):
//
//	P:T:{R}:lock                  Logs: the lock of a Bucket with a per-resource rule
//	P:T:{R}:lock:C                Logs: the lock of a Bucket whose rules are all per-client
//	P:T:{R}:fence:<id>            SortedSet, Windows: the fence of one transaction
//	                              (txn.go), gone within a second
//
//	Logs:
//	P:T:{R}:log:C:<ms>:<n>:<uuid> calls of total weight n (one batch's),
//	                              made at Redis time <ms>; it expires (PXAT)
//	                              when the longest window has passed
//	SortedSet, per rule of window W ms and limit L:
//	P:T:{R}:zset:W:L              a per-resource rule's calls (members C:<id>:<unit>,
//	                              or ~D:<id>:<unit> for a client name over 16 bytes,
//	                              D its 128-bit digest: see memberPrefix)
//	P:T:{R}:zset:W:L:C            a per-client rule's calls (members <id>:<unit>),
//	                              one member per unit of weight, scored by Redis
//	                              time (ms); at most L members
//	Windows, in generation G ("" until the first FlushAll, then "@1", "@2"...):
//	P:T:{R}:hashG                 the resource's weight per interval, when a rule
//	                              is per-resource (field: Redis time / precision,
//	                              <precision>:<Redis time / precision> for all
//	                              but the shortest precision, see intervals.go)
//	P:T:{R}:hashG:C               the client's weight per interval, when a rule
//	                              is per-client
//	P:T:{R}:gen                   the generation, once FlushAll ran; it expires
//	                              with the last hash of its generation, and no
//	                              sooner than genLife after the FlushAll
//
// Why this shape:
//   - The tag keeps apart Buckets that would corrupt each other's counts if
//     they shared them: one that trims or expires calls after its longest
//     window would delete calls that one with a longer window still counts,
//     and hashes of different precisions number their intervals
//     differently. Buckets with the same tag share counts safely: each
//     decides from all of them, and each of their rules holds. Under Logs
//     and Windows, changing a rule's Requests keeps the counts; changing
//     the longest window or the precision starts new ones (the old keys
//     expire on their own). SortedSet keeps a set per (window, limit),
//     capped at the limit, so changing a limit starts a new set.
//   - The hash tag {R} puts every key of a resource in one cluster slot, so
//     the lock, the counts, WATCH and MULTI/EXEC of a decision never cross
//     slots.
//   - base64url has no ':', no brace and no glob metacharacter. So the tag
//     always ends where R ends, the encoding of (resource, client) is
//     injective whatever bytes they hold, and a MATCH pattern for one client
//     (P:{R}:log:C:*) cannot match another client's logs.
//   - "log:", "lock", "zset", "hash", "fence:" and "gen" differ before any
//     pattern's '*', so no pattern of one matches another.
//   - The prefix may hold glob metacharacters: matchPrefix escapes them. It
//     cannot hold braces (New refuses them), or the tag would move.
//
// Every rule counts from the same calls, stamped with Redis time: a rule
// with window w counts the calls stamped after now-w, where now is also
// Redis time. So no client clock is involved, and Logs and SortedSet are
// exact to the millisecond whatever the rules' windows.

// keyspace names the keys of one resource.
type keyspace struct {
	base string // P:{R}:
}

func resourceKeys(prefix, resource string) keyspace {
	return keyspace{base: prefix + ":{" + encode(resource) + "}:"}
}

func encode(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// slotKey is a key in the resource's slot, to find the node that owns it.
func (k keyspace) slotKey() string { return k.base }

func (k keyspace) resourceLock() string { return k.base + "lock" }

func (k keyspace) clientLock(client string) string { return k.base + "lock:" + encode(client) }

// logs is the prefix of every log of the resource.
func (k keyspace) logs() string { return k.base + "log:" }

// clientLogs is the prefix of the logs of one client of the resource.
func (k keyspace) clientLogs(client string) string { return k.logs() + encode(client) + ":" }

// newLog names the log of a call of weight n by client, admitted at Redis
// time at (ms).
func (k keyspace) newLog(client string, at int64, n int) string {
	return k.clientLogs(client) + strconv.FormatInt(at, 10) + ":" + strconv.Itoa(n) + ":" + uuid.NewString()
}

func (k keyspace) sortedSet() string { return k.base + "zset" }

func (k keyspace) clientSortedSet(client string) string { return k.sortedSet() + ":" + encode(client) }

// hashes is the prefix of every Windows hash of the resource.
func (k keyspace) hashes() string { return k.base + "hash" }

// hash is the resource's Windows hash in generation gen ("" until the
// first FlushAll).
func (k keyspace) hash(gen string) string {
	if gen == "" {
		return k.hashes()
	}
	return k.hashes() + "@" + gen
}

func (k keyspace) clientHash(gen, client string) string { return k.hash(gen) + ":" + encode(client) }

// generation holds the generation of the resource's Windows hashes.
func (k keyspace) generation() string { return k.base + "gen" }

// matchPrefix returns the MATCH pattern of every key that starts with
// prefix, taken literally: Redis glob metacharacters are escaped.
func matchPrefix(prefix string) string {
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

// fence names the fence of one transaction (txn.go).
func (k keyspace) fence(id string) string { return k.base + "fence:" + id }
