package store

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
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
	s := sortedSetStore{Plan: p, lockFree: lockFree{clientScoped: p.ClientScoped}, setOf: make([]int, len(p.Rules))}
	for i, r := range p.Rules {
		spec := setSpec{perClient: r.PerClient, window: r.Window, limit: r.Requests}
		s.setOf[i] = slices.Index(s.sets, spec)
		if s.setOf[i] < 0 {
			s.setOf[i] = len(s.sets)
			s.sets = append(s.sets, spec)
			s.lives = append(s.lives, spec.window+clock.LagLimit.Milliseconds())
		}
	}
	return s
}

// sortedSetStore is the SortedSet strategy: a sliding log per rule,
// decided in one MULTI/EXEC without a lock. Each unit of weight of a
// counted call is one member, scored with the Redis time at which the
// call was decided (the host's estimate of it, see package clock). Per
// batch and set, the transaction:
//
//  1. trims the members that have left the window (ZREMRANGEBYSCORE),
//     and reads what is left: ZCARD, the newest member, and as many of
//     the oldest as must leave the window for the batch's heaviest call
//     to fit, unless every call of the batch on the set was sent Far
//     (only a denial's RetryAfter needs them: a Far call the counts deny
//     is decided again, see limits.View.Short);
//  2. adds the members of every call of the batch that writes (ZADD, one
//     for the set), before any of them is evaluated;
//  3. sets the key to expire a window and clock.LagLimit after Redis ran
//     the transaction (PEXPIRE), if the batch wrote to it.
//
// Each call is then evaluated, in order, from the count read, plus the
// calls of the batch recorded before it. A written call that is not
// recorded (denied, or its caller gone) stays counted until a second
// transaction removes its members (ZREM): until then others count it, and
// may be denied, never admitted past a limit. Such a call is one that
// every rule showed this process room for (package foresight): a call it
// saw no room for only looks, and writes nothing.
// With WithRecordDenied every call is kept, and a cap drops the oldest
// (ZREMRANGEBYRANK 0 -(Requests+1), after each call's ZADD): the newest
// Requests attempts decide, as all of them would.
type sortedSetStore struct {
	Plan
	lockFree
	sets  []setSpec // the distinct (scope, window, limit) of the rules
	setOf []int     // by rule: its set
	lives []any     // by set: how long after a write it lives (ms, boxed once)
}

// setSpec is what one set counts: rules with the same one share it.
type setSpec struct {
	perClient bool
	window    int64 // ms
	limit     int
}

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
		return keys.Client(prefix, client)
	}
	return prefix
}

// callID names a call among the members of the sets it is written to:
// the unpadded base64url of 64 random bits, always 11 characters.
func callID() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// member names one unit of weight of a call: its id, and after the first
// unit the unit's number (an id has one length, so no two units or calls
// share a member; versions before wrote "<id>:<unit>", with an id of
// another alphabet, and their members count with these). The client is in
// the members of a per-resource set, for Flush, as memberPrefix names it.
// A member is each call's cost in Redis's memory, once per unit and rule,
// for the whole window: it is kept short.
func member(spec setSpec, client, id string, unit int) string {
	m := id
	if unit > 0 {
		m += strconv.Itoa(unit)
	}
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

func (s sortedSetStore) Decide(ctx context.Context, where Site, calls []limits.Call, evaluate Evaluate) error {
	return decideRound(ctx, where, func(now int64) round {
		b := s.newBatch(where.Keys, now, calls)
		if expected, ok := where.Clock.Expected(); ok {
			b.score = max(now, expected)
		}
		return b
	}, evaluate)
}

// zBatch is the round of one batch on the sets of a resource.
type zBatch struct {
	sortedSetStore
	now    int64 // its stamp: the estimate of Redis's time, less its error (clock.Clock.Earliest)
	score  int64 // its members' score: when Redis is expected to run it (rescored)
	calls  []limits.Call
	sets   []*zSet        // in order of first use
	of     [][]*zWrite    // by call, by rule: the write to that rule's set
	writes [][]*zWrite    // by call: its writes, each once (rules may share a set)
	zadd   []any          // a ZADD's arguments, as addZadd builds them
	counts []limits.Count // the view of the call being evaluated (see Evaluate)
}

// zSet is one set in a batch: where its reads are among the replies, then
// what it holds as the calls are evaluated in order.
type zSet struct {
	key  string
	arg  any // key, boxed once for the set's commands
	spec setSpec
	kind int // the index of spec in the store's
	// full: some call of the batch on the set was not sent Far
	// (limits.Call), so its oldest members are read for a denial's
	// RetryAfter; a Far call's Result, if admitted, needs none, and it is
	// decided again if denied.
	full     bool
	heaviest int   // the heaviest call of the batch on the set
	read     int   // WithRecordDenied: how many of the oldest to read
	members  []any // what the batch adds, in the calls' order
	written  bool  // some call of the batch adds members (others only look)

	card, first, latest int // replies

	held   int            // members held before the call being evaluated
	oldest []limits.Entry // the oldest held, then the batch's own
	newest int64
}

// zWrite is one call's write to one set.
type zWrite struct {
	set     *zSet
	members []any
	evicted int // WithRecordDenied, the reply: how many the cap removed
}

// zRoom is where a batch makes its sets and writes: each call writes to
// at most one set per spec, so they are made in arrays sized once.
type zRoom struct {
	byKey  map[string]*zSet
	sets   []zSet
	writes []zWrite
	refs   []*zWrite // the calls' writes, by call (zBatch.writes)
}

func (s sortedSetStore) newBatch(ks keys.Space, now int64, calls []limits.Call) *zBatch {
	most := len(calls) * len(s.sets) // sets, and writes
	b := &zBatch{sortedSetStore: s, now: now, score: now, calls: calls, of: make([][]*zWrite, len(calls)), writes: make([][]*zWrite, len(calls))}
	room := zRoom{byKey: make(map[string]*zSet, most), sets: make([]zSet, 0, most), writes: make([]zWrite, 0, most), refs: make([]*zWrite, 0, most)}
	b.sets = make([]*zSet, 0, most)
	prefixes := make([]string, len(s.sets)) // of each set's key
	for i, spec := range s.sets {
		prefixes[i] = s.setPrefix(ks, spec)
	}
	of := make([]*zWrite, len(calls)*len(s.Rules))
	for i, c := range calls {
		id := callID()
		b.of[i] = of[i*len(s.Rules) : (i+1)*len(s.Rules)]
		first := len(room.refs)
		for r := range s.Rules {
			if j := slices.Index(s.setOf[:r], s.setOf[r]); j >= 0 {
				b.of[i][r] = b.of[i][j] // rules with one set write once
				continue
			}
			w := b.write(&room, prefixes[s.setOf[r]], s.setOf[r], c, id)
			b.of[i][r] = w
			room.refs = append(room.refs, w)
		}
		b.writes[i] = room.refs[first:len(room.refs):len(room.refs)]
	}
	return b
}

// write returns call c's write to its set of the store's kind, whose
// key starts with prefix, adding the set to the batch if it is new.
func (b *zBatch) write(room *zRoom, prefix string, kind int, c limits.Call, id string) *zWrite {
	spec := b.sortedSetStore.sets[kind]
	key := spec.keyOf(prefix, c.Client)
	set := room.byKey[key]
	if set == nil {
		room.sets = append(room.sets, zSet{key: key, arg: key, spec: spec, kind: kind})
		set = &room.sets[len(room.sets)-1]
		room.byKey[key] = set
		b.sets = append(b.sets, set)
	}
	set.full = set.full || !c.Far || b.RecordDenied
	set.heaviest = max(set.heaviest, c.N)
	if b.RecordDenied {
		set.read = min(max(set.read, c.N)+c.N, spec.limit) // what the cap may drop, and the oldest left
	}
	room.writes = append(room.writes, zWrite{set: set, evicted: -1})
	w := &room.writes[len(room.writes)-1]
	if c.Look {
		return w // it only reads the set
	}
	set.written = true
	first := len(set.members)
	for unit := range c.N {
		set.members = append(set.members, member(spec, c.Client, id, unit))
	}
	w.members = set.members[first:len(set.members):len(set.members)]
	return w
}

// addZadd queues ZADD key score member ... for members, all scored with
// score, built in the batch's scratch array (t.Add copies it).
func (b *zBatch) addZadd(t *txn.Txn, key, score any, members []any) int {
	b.zadd = appendZadd(b.zadd[:0], key, score, members)
	return t.Add(b.zadd...)
}

// queue adds the batch's commands: see sortedSetStore. Room is made for
// them at once, about six commands and twenty arguments a set and two a
// member, and each argument is boxed once: a key serves several commands,
// and so do the bound its kind of set is trimmed to and how long it lives.
func (b *zBatch) queue(t *txn.Txn) {
	members := 0
	for _, set := range b.sets {
		members += len(set.members)
	}
	t.Grow(6*len(b.sets)+2*len(b.calls), 24*len(b.sets)+4*members)
	score, notBefore := any(b.score), any(b.notBefore())
	trims := make([]any, len(b.sortedSetStore.sets))
	for _, set := range b.sets {
		if trims[set.kind] == nil {
			trims[set.kind] = b.now - set.spec.window
		}
		b.queueReads(t, set, trims[set.kind], notBefore)
	}
	if b.RecordDenied {
		b.queueCapped(t, score)
	}
	for _, set := range b.sets {
		if len(set.members) > 0 && !b.RecordDenied {
			b.addZadd(t, set.arg, score, set.members)
		}
		if set.written {
			t.Add("pexpire", set.arg, b.lives[set.kind])
		}
	}
}

// queueReads adds the trim of set, to trim, and its reads: if every call
// on it is Far, only of a member scored after notBefore.
func (b *zBatch) queueReads(t *txn.Txn, set *zSet, trim, notBefore any) {
	t.Add("zremrangebyscore", set.arg, "-inf", trim)
	set.card = t.Add("zcard", set.arg)
	switch {
	case !set.full:
		set.latest = t.Add("zrange", set.arg, "+inf", notBefore, "byscore", "rev", "limit", 0, 1, "withscores")
		return
	case b.RecordDenied:
		set.first = t.Add("zrange", set.arg, 0, set.read-1, "withscores")
	default:
		set.first = t.Add("zrange", set.arg, 0, b.oldestTo(set), "withscores")
	}
	set.latest = t.Add("zrange", set.arg, -1, -1, "withscores")
}

// oldestTo is the last rank of set's oldest members that a denial's
// RetryAfter may need: for a call of weight n evaluated with the set's count
// c (the calls of the batch recorded before it included), the c+n-limit
// oldest must leave the window for it to fit. The batch's own recorded
// calls are newer than any member read, and counted after them; so the
// oldest card+heaviest-limit members read are enough for every call of
// the batch, and none are read while the heaviest fits: ranks 0 to
// -(limit-heaviest+1), which counts from the end of the set. (A call
// heavier than the limit never reaches the store.) The set may hold more
// than limit members (calls written, then denied, not yet taken back),
// and then this reads as many more.
func (b *zBatch) oldestTo(set *zSet) int {
	return set.heaviest - set.spec.limit - 1
}

// queueCapped adds, WithRecordDenied, each call's members, scored score,
// and the cap that drops the oldest past the limit.
func (b *zBatch) queueCapped(t *txn.Txn, score any) {
	for i := range b.calls {
		for _, w := range b.writes[i] {
			if len(w.members) > 0 { // else a call that only looks
				b.addZadd(t, w.set.arg, score, w.members)
				w.evicted = t.Add("zremrangebyrank", w.set.arg, 0, -w.set.spec.limit-1)
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

// appendZadd appends ZADD key flags... score member ... for members, all
// scored with score, to out.
func appendZadd(out []any, key, score any, members []any, flags ...any) []any {
	out = append(out, "zadd", key)
	out = append(out, flags...)
	for _, m := range members {
		out = append(out, score, m)
	}
	return out
}

// conclude asks evaluate about each call in order, given what its sets held, and
// queues the removal of the members of the calls not recorded.
func (b *zBatch) conclude(t *txn.Txn, evaluate Evaluate, back *txn.Txn, now int64) error {
	for _, set := range b.sets {
		set.start(t.Replies)
	}
	var due zBacklog
	// The Results count the calls from the transaction's TIME, as Redis
	// holds them: scored with it (b.score), or scored again with it
	// where they were not (see rescored).
	rescore := rescored(b.score, now) // later ones were settled: see early
	for i := range b.calls {
		v := b.view(i, now)
		kept := keptOf(b.calls[i], b.Rules, v, evaluate(i, v))
		recorded := kept > 0
		b.mirrorWrites(t, i, kept, now, &due)
		if recorded && rescore {
			due.rescore = due.note(due.rescore, b.writes[i])
		}
		back.Urgent = back.Urgent || b.decidedAgain(v, i, recorded)
	}
	for _, set := range b.sets {
		if members := due.undo[set]; len(members) > 0 {
			back.Add(append([]any{"zrem", set.key}, members...)...)
		}
		if members := due.rescore[set]; len(members) > 0 {
			back.Add(appendZadd(make([]any, 0, 4+2*len(members)), set.key, now, members, "xx", "lt")...)
		}
	}
	return nil
}

// decidedAgain reports whether call i, read as v and recorded or not, is
// decided again at once: read Short, and denied by its counts. Its
// take-back must then run before the new decision reads, not ride on a
// later transaction, or the new decision would count the call's own
// members. (A call whose caller gave up is taken back as any other.)
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

// view is what call i's rules counted before it, at Redis's time now:
// Short if a set of the call was read without its oldest members.
func (b *zBatch) view(i int, now int64) limits.View {
	if b.counts == nil {
		b.counts = make([]limits.Count, len(b.Rules))
	}
	v := limits.View{Now: now, Counts: b.counts}
	for r, w := range b.of[i] {
		set := w.set
		v.Counts[r] = limits.Count{Stamp: now, Used: set.held, Oldest: set.oldest, Newest: set.newest}
		v.Short = v.Short || !set.full
	}
	return v
}

// rescored reports whether the members of a transaction, scored score,
// are scored again with its TIME (now), which fell in an earlier
// millisecond of Redis's clock (Redis ran it sooner than expected, which
// the estimate's error allows; one it ran later is settled before its
// calls are evaluated: see early). Scored later than they ran, they would
// stay in their window a millisecond too long, and the Results that count
// them say so. They are scored again by the take-back's transaction (ZADD
// XX LT: only members still there, never later): on an idle line before
// the callers are answered, on a busy one in its next transaction. Until
// then, or for good if it is lost, they count a millisecond longer, which
// denies sooner, never admits past a limit. Scored with when the
// transaction is expected to run (clock.Clock.Expected) rather than the
// estimate less its error, few need either, however far Redis is: the
// estimate less its error trails Redis's time by a round trip when the
// transaction runs, so that its score would be early for a round trip's
// share of a millisecond of decisions, every one once Redis is a
// millisecond away.
func rescored(score, now int64) bool { return now < score }

// early returns, if Redis ran the batch's transaction at now, in a
// later millisecond than its members' score, the transaction that scores
// every member it wrote with now (ZADD XX GT: only members still there,
// and never earlier); nil if it wrote none, or ran in time. Members
// scored before their millisecond would leave their window as early, and
// let it admit past its limit by what it admitted meanwhile, even by one
// millisecond (Per(1, time.Second) admitting twice 999 ms apart). Members
// of calls then denied are scored again too: they are taken back after.
func (b *zBatch) early(_ []any, now int64) *txn.Txn {
	if now <= b.score {
		return nil
	}
	var fix *txn.Txn
	for _, set := range b.sets {
		if len(set.members) == 0 {
			continue
		}
		if fix == nil {
			fix = &txn.Txn{}
		}
		fix.Add(appendZadd(make([]any, 0, 5+2*len(set.members)), set.key, now, set.members, "xx", "gt")...)
	}
	return fix
}

// inTime reports whether the members early scored, scored again at ran,
// were counted by every decision made meanwhile: a decision at Redis time
// r trims and leaves out of a window of w ms the members scored at most
// r - w, and ran bounds every r before it.
func (b *zBatch) inTime(ran int64) bool {
	for _, set := range b.sets {
		if len(set.members) > 0 && ran >= b.score+set.spec.window {
			return false
		}
	}
	return true
}

// landed: the members early scored were scored again. Their take-back
// (ZREM) finds them however they are scored: nothing else changes.
func (b *zBatch) landed() {}

// zBacklog is what a batch leaves to do after its transaction: by set,
// the members to take back, and those to score again. Most batches leave
// nothing: the maps are made on first use.
type zBacklog struct{ undo, rescore map[*zSet][]any }

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

// mirrorWrites updates call i's sets as Redis did, and notes in due the
// members to take back if the call was not recorded.
func (b *zBatch) mirrorWrites(t *txn.Txn, i, kept int, stamp int64, due *zBacklog) {
	for _, w := range b.writes[i] {
		if len(w.members) == 0 {
			continue // it only looked
		}
		evicted := 0
		if b.RecordDenied {
			evicted = int(txn.ReplyInt(t.Replies[w.evicted]))
		}
		switch {
		case kept > 0:
			// Its first kept members stay; the rest of a call AtMost
			// (limits.Call.Weight) is taken back as a denial is.
			w.set.add(kept, evicted, stamp)
			if kept < len(w.members) {
				due.undo = due.note(due.undo, []*zWrite{{set: w.set, members: w.members[kept:]}})
			}
		case b.RecordDenied:
			w.set.add(len(w.members), evicted, stamp)
		}
		// A write the cap made room for dropped calls counted in the
		// window: taken back, it would leave the set short of them.
		if kept == 0 && evicted == 0 {
			due.undo = due.note(due.undo, []*zWrite{w})
		}
	}
}

// takeAll queues the removal of every call's members; WithRecordDenied,
// only of those the cap dropped nothing for, as t's replies show: a write
// it made room for stays counted, as an attempt that reached Redis, in
// the stead of the call it dropped (and all do when the replies were
// lost). Later calls are denied sooner, never admitted past a limit.
func (b *zBatch) takeAll(t, back *txn.Txn) {
	for i := range b.calls {
		for _, w := range b.writes[i] {
			if len(w.members) == 0 || b.RecordDenied && !droppedNone(t, w) {
				continue
			}
			back.Add(append([]any{"zrem", w.set.key}, w.members...)...)
		}
	}
}

// droppedNone reports whether t's replies show that the cap dropped no
// member to make room for w.
func droppedNone(t *txn.Txn, w *zWrite) bool {
	return t.Replies != nil && w.evicted >= 0 && txn.ReplyInt(t.Replies[w.evicted]) == 0
}

func (b *zBatch) idempotent() bool { return true }

// start reads what the set held before the batch's calls.
func (set *zSet) start(replies []any) {
	set.held = int(txn.ReplyInt(replies[set.card]))
	if latest := txn.ReplyScores(replies[set.latest]); len(latest) > 0 {
		set.newest = int64(latest[0])
	}
	if !set.full {
		return // the oldest were not read
	}
	for _, score := range txn.ReplyScores(replies[set.first]) {
		set.oldest = append(set.oldest, limits.Entry{At: int64(score), Weight: 1})
	}
}

// add counts in the set the n members of a call recorded at stamp, as
// Redis holds them: WithRecordDenied, less the evicted oldest.
func (set *zSet) add(n, evicted int, stamp int64) {
	set.held += n - evicted
	set.newest = max(set.newest, stamp)
	if !set.full {
		return // no denial is answered from it (see zSet.full): no oldest kept
	}
	set.oldest = set.oldest[min(evicted, len(set.oldest)):]
	for range n {
		set.oldest = append(set.oldest, limits.Entry{At: stamp, Weight: 1})
	}
}

// Peek counts without writing: ZCOUNT of the live members, the oldest and
// the newest, per set, at the estimated Redis time. The oldest are those
// that must leave the window for a call of weight n to fit: the live
// count less the limit, plus n (see zBatch.oldestTo), after the members
// that left the window but are not trimmed yet. With WithRecordDenied a
// set holds at most its limit, but a denied call counts too, so
// RetryAfter may wait for the oldest 2n to leave: those are read.
func (s sortedSetStore) Peek(ctx context.Context, where Site, client string, n int) (limits.View, error) {
	now, err := where.Clock.Estimate(ctx, where.Node)
	if err != nil {
		return limits.View{}, err
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
			if s.RecordDenied {
				sets[i].oldest = pipe.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: from, Max: "+inf", Count: int64(2 * n)})
			} else {
				sets[i].oldest = pipe.ZRangeWithScores(ctx, key, 0, int64(n-spec.limit-1))
			}
			sets[i].latest = pipe.ZRangeWithScores(ctx, key, -1, -1)
		}
		return nil
	})
	if err != nil {
		return limits.View{}, err
	}
	v := limits.View{Now: now, Counts: make([]limits.Count, len(s.Rules))}
	for r, rule := range s.Rules {
		set := sets[s.setOf[r]]
		c := limits.Count{Stamp: now, Used: int(set.live.Val())}
		for _, z := range set.oldest.Val() {
			if e := (limits.Entry{At: int64(z.Score), Weight: 1}); rule.Counts(e, now) {
				c.Oldest = append(c.Oldest, e)
			}
		}
		if latest := set.latest.Val(); len(latest) > 0 {
			c.Newest = int64(latest[0].Score)
		}
		v.Counts[r] = c
		// Another process's call, or a call scored again with its
		// transaction's TIME, may be newer than this estimate, which
		// lags Redis's time by up to its error; Redis had reached that
		// call's time when it was read. The durations are counted from
		// it then, as a decision's are from its transaction's TIME, so
		// that none exceeds its window; the counts stand at the estimate.
		v.Now = max(v.Now, c.Newest)
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

// Tag is the longest window: the sets' own keys carry each rule's window
// and limit.
func (s sortedSetStore) Tag() string { return "w" + strconv.FormatInt(s.Longest, 10) }
