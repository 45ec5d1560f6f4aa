package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// NewSortedSet returns the store of SortedSet for p.
func NewSortedSet(p Plan) Store {
	s := sortedSetStore{Plan: p, setOf: make([]int, len(p.Rules))}
	for i, r := range p.Rules {
		spec := setSpec{perClient: r.PerClient, window: r.Window, limit: r.Requests}
		s.setOf[i] = slices.Index(s.sets, spec)
		if s.setOf[i] < 0 {
			s.setOf[i] = len(s.sets)
			s.sets = append(s.sets, spec)
		}
	}
	return s
}

// sortedSetStore is the SortedSet strategy: a sliding log per rule, capped
// at the rule's Requests, decided in one MULTI/EXEC without a lock. Each
// unit of weight of a counted call is one member, scored with the Redis
// time at which the call was decided (the host's estimate of it, see
// package clock). Per batch and set, the transaction:
//
//  1. trims the members that have left the window (ZREMRANGEBYSCORE),
//     and reads what is left: ZCARD, the newest member, and the oldest
//     ones unless every call of the batch on the set was sent Far (only
//     a denial's RetryAfter needs them: a Far call the counts deny is
//     decided again, see limits.View.Short);
//  2. for each call, in order: adds its members with a score above any
//     time (ZADD pending), removes whatever is now past the cap
//     (ZREMRANGEBYRANK Requests -1: only pending members can be there, as
//     the set held at most Requests before), and gives the members that
//     stayed their real score (ZADD XX);
//  3. sets the key to expire clock.LagLimit after its newest member leaves the
//     window, unless it expires later already (PEXPIREAT NX, then GT),
//     if the batch wrote to it.
//
// So a call that does not fit is gone before EXEC returns: it never makes
// another caller see the set fuller than it is. A call the cap let in may
// still be denied by another rule, or be a weighted call that fit only in
// part: its members are then removed by a second round trip (ZREM), and
// until then others count them. Such a call is one that every rule showed
// this process room for (package foresight): a call it saw no room for only
// looks, and writes nothing.
// With WithRecordDenied every call is kept and the cap drops the oldest
// instead: the newest Requests attempts decide, as all of them would.
type sortedSetStore struct {
	Plan
	lockFree
	sets  []setSpec // the distinct (scope, window, limit) of the rules
	setOf []int     // by rule: its set
}

// setSpec is what one set counts: rules with the same one share it.
type setSpec struct {
	perClient bool
	window    int64 // ms
	limit     int
}

// pending is the score of a member not yet decided: above any time, so
// that the cap removes pending members before any decided one.
const pendingScore = "4503599627370496" // 2^52, exact in a float64

func (s sortedSetStore) key(ks keys.Space, spec setSpec, client string) string {
	return spec.keyOf(s.setPrefix(ks, spec), client)
}

// setPrefix is what the keys of spec's sets start with: the key of its
// per-resource set.
func (sortedSetStore) setPrefix(ks keys.Space, spec setSpec) string {
	return ks.SortedSet() + ":" + strconv.FormatInt(spec.window, 10) + ":" + strconv.Itoa(spec.limit)
}

// keyOf is the key of client's set of spec, whose keys start with prefix.
func (spec setSpec) keyOf(prefix, client string) string {
	if spec.perClient {
		return prefix + ":" + keys.Encode(client)
	}
	return prefix
}

// member names one unit of weight of a call: the client is in the members
// of a per-resource set, for Flush, as memberPrefix names it.
func member(spec setSpec, client, id string, unit int) string {
	m := id + ":" + strconv.Itoa(unit)
	if !spec.perClient {
		m = memberPrefix(client) + m
	}
	return m
}

// shortClient is the longest client name that a member carries whole.
const shortClient = 16

// memberPrefix is how the members of a per-resource set name client: its
// encoding and ':' for a name of at most shortClient bytes (at most 22
// characters, as every version wrote them), else '~', a 128-bit digest
// (the first 16 bytes of its SHA-256, encoded) and ':', so that a member
// is at most about 50 bytes whatever the name. No encoding holds '~' or
// ':', so one client's prefix is never another's unless two long names
// share a digest, a chance of 2^-128 per pair: Flush removes the members
// with the client's prefix, and one that removed another client's
// admitted members would let that many more in.
func memberPrefix(client string) string {
	if len(client) <= shortClient {
		return keys.Encode(client) + ":"
	}
	sum := sha256.Sum256([]byte(client))
	return "~" + base64.RawURLEncoding.EncodeToString(sum[:16]) + ":"
}

func (s sortedSetStore) Decide(ctx context.Context, where Site, calls []limits.Call, judge Judge) error {
	return decideRound(ctx, where, func(now int64) round { return s.newBatch(where.Keys, now, calls) }, judge)
}

// zBatch is the round of one batch on the sets of a resource.
type zBatch struct {
	sortedSetStore
	now    int64
	calls  []limits.Call
	sets   []*zSet     // in order of first use
	of     [][]*zWrite // by call, by rule: the write to that rule's set
	writes [][]*zWrite // by call: its writes, each once (rules may share a set)
}

// zSet is one set in a batch: where its reads are among the replies, then
// what it holds as the calls are judged in order.
type zSet struct {
	key  string
	arg  any // key, boxed once for the set's commands
	spec setSpec
	// read is how many oldest members to read: none when every call of
	// the batch on the set was sent Far (limits.Call), whose Results, if
	// admitted, need none, and which are decided again if denied.
	read int

	written bool // some call of the batch adds members (others only look)

	card, first, latest int // replies

	held   int            // members held before the call being judged
	oldest []limits.Entry // the oldest held, then the batch's own
	newest int64
}

// zWrite is one call's write to one set.
type zWrite struct {
	set     *zSet
	members []any
	evicted int // reply: how many members the cap removed
}

func (s sortedSetStore) newBatch(ks keys.Space, now int64, calls []limits.Call) *zBatch {
	b := &zBatch{sortedSetStore: s, now: now, calls: calls, of: make([][]*zWrite, len(calls)), writes: make([][]*zWrite, len(calls))}
	byKey := map[string]*zSet{}
	prefixes := make([]string, len(s.sets)) // of each set's key
	for i, spec := range s.sets {
		prefixes[i] = s.setPrefix(ks, spec)
	}
	for i, c := range calls {
		id := strconv.FormatUint(rand.Uint64(), 36)
		b.of[i] = make([]*zWrite, len(s.Rules))
		for r := range s.Rules {
			if j := slices.Index(s.setOf[:r], s.setOf[r]); j >= 0 {
				b.of[i][r] = b.of[i][j] // rules with one set write once
				continue
			}
			w := b.write(byKey, prefixes[s.setOf[r]], s.sets[s.setOf[r]], c, id)
			b.of[i][r] = w
			b.writes[i] = append(b.writes[i], w)
		}
	}
	return b
}

// write returns call c's write to the set spec, whose key starts with
// prefix, adding the set to the batch if it is new.
func (b *zBatch) write(byKey map[string]*zSet, prefix string, spec setSpec, c limits.Call, id string) *zWrite {
	key := spec.keyOf(prefix, c.Client)
	set := byKey[key]
	if set == nil {
		set = &zSet{key: key, arg: key, spec: spec}
		byKey[key] = set
		b.sets = append(b.sets, set)
	}
	if !c.Far || b.RecordDenied {
		set.read = max(set.read, c.N)
	}
	if b.RecordDenied {
		set.read = min(set.read+c.N, spec.limit) // what the cap may drop, and the oldest left
	}
	w := &zWrite{set: set, evicted: -1}
	if c.Look {
		return w // it only reads the set
	}
	set.written = true
	w.members = make([]any, c.N)
	for unit := range c.N {
		w.members[unit] = member(spec, c.Client, id, unit)
	}
	return w
}

// queue adds the batch's commands: see sortedSetStore. Each argument is
// boxed once (a key serves about eight commands).
func (b *zBatch) queue(t *txn.Txn) {
	now := any(b.now)
	for _, set := range b.sets {
		t.Add("zremrangebyscore", set.arg, "-inf", b.now-set.spec.window)
		set.card = t.Add("zcard", set.arg)
		if set.read == 0 {
			set.latest = t.Add("zrange", set.arg, "+inf", b.notBefore(), "byscore", "rev", "limit", 0, 1, "withscores")
			continue
		}
		set.first = t.Add("zrange", set.arg, 0, set.read-1, "withscores")
		set.latest = t.Add("zrange", set.arg, -1, -1, "withscores")
	}
	for i := range b.calls {
		for _, w := range b.writes[i] {
			if len(w.members) > 0 { // else a call that only looks
				b.queueWrite(t, w, now)
			}
		}
	}
	for _, set := range b.sets {
		if set.written {
			for _, cmd := range txn.ExtendTo(set.arg, b.now+set.spec.window+clock.LagLimit.Milliseconds()) {
				t.Add(cmd...)
			}
		}
	}
}

// notBefore is the bound of the newest member a set whose calls are all
// Far reads: only one scored after it, which is rare (another process's
// stamp can trail this batch's only by a round trip or so). The newest
// member then counts for ResetAfter; else the newest counted is the
// call's own stamp once it is recorded, as every member is scored at most
// the bound, and the bound at most the stamp the Results count from: a
// transaction that Redis ran more than clock.Jump before its stamp is
// made again (stampOff), so stamp = min(b.now, TIME) >= b.now - Jump.
// A Far call that is not recorded is decided again, on a full read.
func (b *zBatch) notBefore() string {
	return "(" + strconv.FormatInt(b.now-clock.Jump.Milliseconds(), 10)
}

// queueWrite adds the commands of one call's write: its members, and the
// cap.
func (b *zBatch) queueWrite(t *txn.Txn, w *zWrite, now any) {
	set := w.set
	if b.RecordDenied {
		t.Add(zadd(set.arg, now, w.members)...)
		w.evicted = t.Add("zremrangebyrank", set.arg, 0, -set.spec.limit-1)
		return
	}
	t.Add(zadd(set.arg, pendingScore, w.members)...)
	w.evicted = t.Add("zremrangebyrank", set.arg, set.spec.limit, -1)
	t.Add(zadd(set.arg, now, w.members, "xx")...)
}

// zadd returns ZADD key flags... score member ... for members, all
// scored with score, in one slice.
func zadd(key, score any, members []any, flags ...any) []any {
	out := make([]any, 0, 2+len(flags)+2*len(members))
	out = append(out, "zadd", key)
	out = append(out, flags...)
	for _, m := range members {
		out = append(out, score, m)
	}
	return out
}

// judge asks judge about each call in order, given what its sets held, and
// queues the removal of the members of the calls not recorded.
func (b *zBatch) judge(t *txn.Txn, judge Judge, back *txn.Txn, now int64) error {
	for _, set := range b.sets {
		set.start(t.Replies)
	}
	var due zBacklog
	// The calls were scored with the estimate of Redis's time, off by at
	// most its error: the Results count them from Redis's own time when it
	// is earlier, so that a stopped clock (a test's) gives the same Results
	// every run.
	stamp := min(b.now, now)
	restamp := now-b.now > maxEarly
	for i := range b.calls {
		v := b.view(t, i, now, stamp)
		recorded := judge(i, v)
		b.settleWrites(t, i, recorded, stamp, &due)
		if recorded && restamp {
			due.late = due.note(due.late, b.writes[i])
		}
		back.Urgent = back.Urgent || b.decidedAgain(v, i, recorded)
	}
	for _, set := range b.sets {
		if members := due.undo[set]; len(members) > 0 {
			back.Add(append([]any{"zrem", set.key}, members...)...)
		}
		if members := due.late[set]; len(members) > 0 {
			back.Add(zadd(set.key, now, members, "xx", "gt")...)
		}
	}
	return nil
}

// decidedAgain reports whether call i, read as v and recorded or not, is
// decided again at once: read Short, and denied by its counts. Its
// take-back must then run before, not ride on a later transaction, or
// the new decision would count the call's own members. (A call whose
// caller gave up is taken back as any other.)
func (b *zBatch) decidedAgain(v limits.View, i int, recorded bool) bool {
	if !v.Short || recorded {
		return false
	}
	for r, rule := range b.Rules {
		if !rule.HasRoom(v.Counts[r].Used, b.calls[i].N) {
			return true
		}
	}
	return false
}

// view is what call i's rules counted before it: Short if a set of the
// call was read without its oldest members.
func (b *zBatch) view(t *txn.Txn, i int, now, stamp int64) limits.View {
	v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
	for r, w := range b.of[i] {
		v.Counts[r] = w.count(t.Replies, b.calls[i].N, b.RecordDenied)
		v.Counts[r].Stamp = stamp
		v.Short = v.Short || w.set.read == 0
	}
	return v
}

// maxEarly bounds, in ms, how much earlier than Redis's time a recorded
// call's members may stay scored. The stamp is the estimate of Redis's
// time less its error, so it is never late, but the transaction runs a
// round trip after it, later still on a loaded host: members scored that
// early would leave their window as early, and let it admit past its
// limit by what it admitted meanwhile. Those of a transaction that ran
// more than maxEarly after its stamp are scored again with its TIME, by
// the take-back's transaction (ZADD XX GT: never earlier, and only members
// still there), long before their window ends.
const maxEarly = 1

// zBacklog is what a batch leaves to do after its transaction: by set,
// the members to take back, and those to score again. Most batches leave
// nothing: the maps are made on first use.
type zBacklog struct{ undo, late map[*zSet][]any }

// note adds the members of writes to m, and returns m.
func (zBacklog) note(m map[*zSet][]any, writes []*zWrite) map[*zSet][]any {
	for _, w := range writes {
		if len(w.members) > 0 {
			if m == nil {
				m = map[*zSet][]any{}
			}
			m[w.set] = append(m[w.set], w.members...)
		}
	}
	return m
}

// settleWrites updates call i's sets as Redis did, and notes in due the
// members to take back if the call was not recorded.
func (b *zBatch) settleWrites(t *txn.Txn, i int, recorded bool, stamp int64, due *zBacklog) {
	for _, w := range b.writes[i] {
		if len(w.members) == 0 {
			continue // it only looked
		}
		evicted := int(txn.ReplyInt(t.Replies[w.evicted]))
		w.set.after(w, evicted, stamp, b.RecordDenied)
		// Without WithRecordDenied the cap removed the newest members,
		// which are the call's: all of them, for a call that did not fit.
		if !recorded && (b.RecordDenied || evicted < len(w.members)) {
			due.undo = due.note(due.undo, []*zWrite{w})
		}
	}
}

// takeAll queues the removal of every call's members.
func (b *zBatch) takeAll(_, back *txn.Txn) {
	for i := range b.calls {
		for _, w := range b.writes[i] {
			if len(w.members) == 0 {
				continue
			}
			back.Add(append([]any{"zrem", w.set.key}, w.members...)...)
		}
	}
}

func (b *zBatch) idempotent() bool { return true }

// start reads what the set held before the batch's calls.
func (set *zSet) start(replies []any) {
	set.held = int(txn.ReplyInt(replies[set.card]))
	if latest := txn.ReplyScores(replies[set.latest]); len(latest) > 0 {
		set.newest = int64(latest[0])
	}
	if set.read == 0 {
		return // the oldest were not read
	}
	for _, score := range txn.ReplyScores(replies[set.first]) {
		set.oldest = append(set.oldest, limits.Entry{At: int64(score), Weight: 1})
	}
}

// count is what the set counted before w's call. Without
// WithRecordDenied the cap decided in Redis: if it removed any of the
// call's members, the rule had no room, whatever the count says.
func (w *zWrite) count(replies []any, n int, recordDenied bool) limits.Count {
	set := w.set
	used := set.held
	if w.evicted < 0 {
		return limits.Count{Used: used, Oldest: set.oldest, Newest: set.newest} // it only looks
	}
	if evicted := int(txn.ReplyInt(replies[w.evicted])); evicted > 0 && !recordDenied {
		used = max(used, set.spec.limit-n+evicted)
	}
	return limits.Count{Used: used, Oldest: set.oldest, Newest: set.newest}
}

// after updates what the set holds once w's call was added, as Redis did.
func (set *zSet) after(w *zWrite, evicted int, now int64, recordDenied bool) {
	n := len(w.members)
	set.held += n - evicted
	if recordDenied {
		set.oldest = set.oldest[min(evicted, len(set.oldest)):]
		evicted = 0
	}
	for range n - evicted {
		set.oldest = append(set.oldest, limits.Entry{At: now, Weight: 1})
	}
	set.newest = max(set.newest, now)
}

// Peek counts without writing: ZCOUNT of the live members, the oldest n
// and the newest, per set, at the estimated Redis time. With
// WithRecordDenied a denied call counts too, so RetryAfter may wait for
// the oldest 2n to leave: those are read.
func (s sortedSetStore) Peek(ctx context.Context, where Site, client string, n int) (limits.View, error) {
	now, err := where.Clock.Estimate(ctx, where.Node)
	if err != nil {
		return limits.View{}, err
	}
	if s.RecordDenied {
		n *= 2
	}
	type reads struct {
		live   *redis.IntCmd
		oldest *redis.ZSliceCmd
		latest *redis.ZSliceCmd
	}
	sets := make([]reads, len(s.sets))
	_, err = where.Node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, spec := range s.sets {
			key, from := s.key(where.Keys, spec, client), "("+strconv.FormatInt(now-spec.window, 10)
			sets[i].live = pipe.ZCount(ctx, key, from, "+inf")
			sets[i].oldest = pipe.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: from, Max: "+inf", Count: int64(n)})
			sets[i].latest = pipe.ZRangeWithScores(ctx, key, -1, -1)
		}
		return nil
	})
	if err != nil {
		return limits.View{}, err
	}
	v := limits.View{Now: now, Counts: make([]limits.Count, len(s.Rules))}
	for r := range s.Rules {
		set := sets[s.setOf[r]]
		c := limits.Count{Stamp: now, Used: int(set.live.Val())}
		for _, z := range set.oldest.Val() {
			c.Oldest = append(c.Oldest, limits.Entry{At: int64(z.Score), Weight: 1})
		}
		if latest := set.latest.Val(); len(latest) > 0 {
			c.Newest = int64(latest[0].Score)
		}
		v.Counts[r] = c
	}
	return v, nil
}

// Flush deletes the client's own sets, and removes its members from the
// resource's: a decision made meanwhile is kept, as if after the Flush.
func (s sortedSetStore) Flush(ctx context.Context, where Site, client string) error {
	var own []string
	shared := map[string]*redis.StringSliceCmd{}
	_, err := where.Node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, spec := range s.sets {
			key := s.key(where.Keys, spec, client)
			if spec.perClient {
				own = append(own, key)
			} else {
				shared[key] = pipe.ZRange(ctx, key, 0, -1)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A long name's members written before the digest carry it whole.
	mine, before := memberPrefix(client), keys.Encode(client)+":"
	_, err = where.Node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		if len(own) > 0 {
			pipe.Del(ctx, own...)
		}
		for key, members := range shared {
			var gone []any
			for _, m := range members.Val() {
				if strings.HasPrefix(m, mine) || strings.HasPrefix(m, before) {
					gone = append(gone, m)
				}
			}
			if len(gone) > 0 {
				pipe.ZRem(ctx, key, gone...)
			}
		}
		return nil
	})
	return err
}

// FlushAll deletes every set of the resource: one DEL of the resource's
// sets, or, when a rule is per-client, of every set SCAN finds.
func (s sortedSetStore) FlushAll(ctx context.Context, where Site) error {
	if s.HasClientRule {
		return deleteUnder(ctx, where, where.Keys.SortedSet()+":", s.ScanCount)
	}
	ks := make([]string, len(s.sets))
	for i, spec := range s.sets {
		ks[i] = s.key(where.Keys, spec, "")
	}
	return where.Node.Del(ctx, ks...).Err()
}

// tag is the longest window: the sets' own keys carry each rule's window
// and limit.
func (s sortedSetStore) Counting() Counting { return Counting{Capped: s.RecordDenied} }

func (s sortedSetStore) Tag() string { return "w" + strconv.FormatInt(s.Longest, 10) }
