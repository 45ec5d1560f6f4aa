package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

type windowsStrategy struct{ precision time.Duration }

func (w windowsStrategy) String() string { return "windows(" + w.precision.String() + ")" }

// MaxWindowsRequests bounds the Requests of a rule under Windows, so that
// no interval's HINCRBY can overflow, even with a thousand calls of the
// largest weight not yet taken back.
const MaxWindowsRequests = 1 << 50

func (w windowsStrategy) newStore(p plan) (store, error) {
	if w.precision < time.Millisecond {
		return nil, invalidStrategy(w, "precision under 1ms")
	}
	for _, r := range p.rules {
		if r.Limit.Requests > MaxWindowsRequests {
			return nil, invalidStrategy(w, "rule %v: more than MaxWindowsRequests (%d)", r, MaxWindowsRequests)
		}
		if r.Limit.Window < w.precision {
			return nil, invalidStrategy(w, "precision longer than the window of rule %v", r)
		}
	}
	return windowsStore{plan: p, precision: w.precision.Milliseconds()}, nil
}

// windowsStore is the Windows strategy: precision-bucket sliding windows,
// decided in one MULTI/EXEC without a lock. Each hash maps an interval
// (Redis time / precision) to the weight added in it, and one hash serves
// every rule of its scope: a rule counts the intervals whose end is inside
// its window. The resource's hash exists when a rule is per-resource, each
// client's when a rule is per-client. Per batch, the transaction:
//
//  1. makes sure each hash has an incarnation ("i", HSETNX: a random name
//     that changes when the hash is deleted and made again), and deletes
//     the intervals that just left the longest window;
//  2. for each call, in order, adds its weight to the current interval
//     with HINCRBY: the value returned counts the calls of the interval
//     before it, first come first served;
//  3. reads every hash (HGETALL) and sets it to expire with the current
//     interval.
//
// A call is admitted if every rule has room given the intervals read and
// its own HINCRBY's value. A call that was not (or whose caller gave up)
// is then taken back, in a second round trip the caller does not wait
// for: HINCRBY of a discount field "d<interval>:<incarnation>" that readers
// subtract from the interval. A discount never makes a count negative,
// even if Flush or FlushAll ran in between: readers apply only the
// discounts of the hash's current incarnation, and a deleted hash comes
// back with a new one. Until the take-back lands others count the call:
// at worst they are denied for that round trip.
type windowsStore struct {
	plan
	precision int64 // ms
}

// incarnation is the field that names a hash's incarnation.
const incarnation = "i"

// stamp is the last millisecond of now's interval: every call of an
// interval counts as made then, so none leaves a window early.
func (s windowsStore) stamp(now int64) int64 { return (now/s.precision+1)*s.precision - 1 }

// hashes returns the hashes a call by client writes and reads.
func (s windowsStore) hashes(keys keyspace, client string) []string {
	var out []string
	if !s.clientScoped {
		out = append(out, keys.hash())
	}
	if s.hasClientRule {
		out = append(out, keys.clientHash(client))
	}
	return out
}

func (s windowsStore) decide(ctx context.Context, at site, calls []request, judge judgeFunc) error {
	now, err := at.clock.estimate(ctx, at.node)
	if err != nil {
		return err
	}
	b := s.newBatch(at.keys, now, calls)
	sent := time.Now()
	_, err = at.node.TxPipelined(ctx, b.queue)
	at.clock.sample(b.clock, sent)
	if err != nil {
		return err
	}
	if after := b.judge(judge); !after.empty() {
		// Best effort: a take-back that is lost only makes others count
		// more, until the interval leaves the window.
		_, _ = at.node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			after.queue(ctx, pipe)
			return nil
		})
	}
	return nil
}

// hBatch is one decision's transaction on the hashes of a resource.
type hBatch struct {
	windowsStore
	keys          keyspace
	now, interval int64
	calls         []request
	hashes        map[string]*hash
	order         []*hash
	added         [][]*redis.IntCmd // by call, by hash of the call
	clock         *redis.TimeCmd
}

// hash is one hash of a batch: its read, then its intervals.
type hash struct {
	key  string
	read *redis.MapStringStringCmd

	inc      string
	entries  []logEntry // the intervals other than the current one, oldest first
	current  int        // the current interval's weight in the read, less its discount
	discount int        // the current interval's discount
	dead     []string   // fields no window counts any more
}

func (s windowsStore) newBatch(keys keyspace, now int64, calls []request) *hBatch {
	b := &hBatch{windowsStore: s, keys: keys, now: now, interval: now / s.precision, calls: calls, hashes: map[string]*hash{}}
	for _, c := range calls {
		for _, key := range s.hashes(keys, c.client) {
			if b.hashes[key] == nil {
				h := &hash{key: key}
				b.hashes[key] = h
				b.order = append(b.order, h)
			}
		}
	}
	return b
}

// lastDead is the newest interval that no window counts at now.
func (s windowsStore) lastDead(now int64) int64 { return (now+1-s.longest)/s.precision - 1 }

func (b *hBatch) queue(pipe redis.Pipeliner) error {
	ctx := context.Background() // go-redis sends with the pipeline's own
	b.clock = pipe.Time(ctx)
	dead := b.lastDead(b.now)
	for _, h := range b.order {
		pipe.HSetNX(ctx, h.key, incarnation, strconv.FormatUint(rand.Uint64(), 36))
		pipe.HDel(ctx, h.key, fields(dead-3, dead)...)
	}
	field := strconv.FormatInt(b.interval, 10)
	b.added = make([][]*redis.IntCmd, len(b.calls))
	for i, c := range b.calls {
		for _, key := range b.windowsStore.hashes(b.keys, c.client) {
			b.added[i] = append(b.added[i], pipe.HIncrBy(ctx, key, field, int64(c.n)))
		}
	}
	expireAt := time.UnixMilli(b.stamp(b.now) + b.longest)
	for _, h := range b.order {
		h.read = pipe.HGetAll(ctx, h.key)
		pipe.PExpireAt(ctx, h.key, expireAt)
	}
	return nil
}

// fields names the intervals from to through.
func fields(from, through int64) []string {
	var out []string
	for i := from; i <= through; i++ {
		out = append(out, strconv.FormatInt(i, 10))
	}
	return out
}

// takeBacks are the writes after a batch: discounts of the calls not
// recorded, by hash and field, and dead fields to delete.
type takeBacks struct {
	discounts map[string]map[string]int64
	dead      map[string][]string
	expireAt  time.Time
}

func (t *takeBacks) empty() bool { return len(t.discounts) == 0 && len(t.dead) == 0 }

func (t *takeBacks) discount(key, field string, n int) {
	if t.discounts[key] == nil {
		t.discounts[key] = map[string]int64{}
	}
	t.discounts[key][field] += int64(n)
}

func (t *takeBacks) queue(ctx context.Context, pipe redis.Pipeliner) {
	for key, fields := range t.dead {
		pipe.HDel(ctx, key, fields...)
	}
	for key, fields := range t.discounts {
		for field, n := range fields {
			pipe.HIncrBy(ctx, key, field, n)
		}
		// The hash may have been deleted and made again meanwhile.
		pipe.PExpireAt(ctx, key, t.expireAt)
	}
}

// judge asks judge about each call in order, and returns the writes to
// send after: the take-backs of the calls not recorded.
func (b *hBatch) judge(judge judgeFunc) *takeBacks {
	after := &takeBacks{discounts: map[string]map[string]int64{}, dead: map[string][]string{}, expireAt: time.UnixMilli(b.stamp(b.now) + b.longest)}
	for _, h := range b.order {
		h.parse(b.windowsStore, b.now, h.read.Val())
		if len(h.dead) > 0 {
			after.dead[h.key] = h.dead
		}
	}
	stamp := b.stamp(b.now)
	for i, c := range b.calls {
		keys := b.windowsStore.hashes(b.keys, c.client)
		v := view{now: b.now, stamp: stamp, counts: make([]count, len(b.rules))}
		for r, rule := range b.rules {
			k := b.hashOf(rule)
			h := b.hashes[keys[k]]
			before := int(b.added[i][k].Val()) - c.n - h.discount
			v.counts[r] = countOf(rule, h.withCurrent(stamp, before), b.now)
		}
		if judge(i, v) {
			continue
		}
		for _, key := range keys {
			after.discount(key, discountField(b.interval, b.hashes[key].inc), c.n)
		}
	}
	return after
}

// hashOf is the index, among a call's hashes, of the one rule counts in.
func (s windowsStore) hashOf(rule Rule) int {
	if rule.Scope == ScopeClient && !s.clientScoped {
		return 1
	}
	return 0
}

func discountField(interval int64, inc string) string {
	return "d" + strconv.FormatInt(interval, 10) + ":" + inc
}

// parse reads a hash's fields at now: its incarnation, its intervals less
// their discounts, and the fields no window counts any more. Fields that
// are none of these are not ours.
func (h *hash) parse(s windowsStore, now int64, fields map[string]string) {
	h.inc = fields[incarnation]
	current, lastDead := now/s.precision, s.lastDead(now)
	weights := map[int64]int{}
	for field, value := range fields {
		index, inc, isDiscount := parseField(field)
		n, err := strconv.Atoi(value)
		switch {
		case field == incarnation, err != nil:
		case index <= lastDead || isDiscount && inc != h.inc:
			h.dead = append(h.dead, field)
		case isDiscount:
			weights[index] -= n
			if index == current {
				h.discount += n
			}
		default:
			weights[index] += n
		}
	}
	for index, n := range weights {
		if index == current {
			h.current = n
		} else if n > 0 {
			h.entries = append(h.entries, logEntry{id: strconv.FormatInt(index, 10), at: (index+1)*s.precision - 1, weight: n})
		}
	}
	slices.SortFunc(h.entries, func(a, b logEntry) int { return int(a.at - b.at) })
}

// parseField reads an interval field "<index>" or a discount field
// "d<index>:<incarnation>"; index is -1 for anything else.
func parseField(field string) (index int64, inc string, isDiscount bool) {
	if rest, ok := strings.CutPrefix(field, "d"); ok {
		num, inc, ok := strings.Cut(rest, ":")
		index, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil {
			return -1, "", false
		}
		return index, inc, true
	}
	index, err := strconv.ParseInt(field, 10, 64)
	if err != nil {
		return -1, "", false
	}
	return index, "", false
}

// withCurrent returns the hash's intervals with the current one, stamped
// at stamp, holding weight.
func (h *hash) withCurrent(stamp int64, weight int) []logEntry {
	if weight <= 0 {
		return h.entries
	}
	out := make([]logEntry, 0, len(h.entries)+1)
	at, _ := slices.BinarySearchFunc(h.entries, stamp, func(e logEntry, t int64) int { return int(e.at - t) })
	out = append(append(append(out, h.entries[:at]...), logEntry{at: stamp, weight: weight}), h.entries[at:]...)
	return out
}

// peek reads the hashes and TIME in one round trip.
func (s windowsStore) peek(ctx context.Context, at site, client string, _ int) (view, error) {
	keys := s.hashes(at.keys, client)
	reads := make([]*redis.MapStringStringCmd, len(keys))
	var clock *redis.TimeCmd
	_, err := at.node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, key := range keys {
			reads[i] = pipe.HGetAll(ctx, key)
		}
		clock = pipe.Time(ctx)
		return nil
	})
	if err != nil {
		return view{}, err
	}
	now := clock.Val().UnixMilli()
	hashes := make([]*hash, len(keys))
	for i, read := range reads {
		hashes[i] = &hash{key: keys[i]}
		hashes[i].parse(s, now, read.Val())
	}
	stamp := s.stamp(now)
	v := view{now: now, stamp: stamp, counts: make([]count, len(s.rules))}
	for r, rule := range s.rules {
		h := hashes[s.hashOf(rule)]
		v.counts[r] = countOf(rule, h.withCurrent(stamp, h.current), now)
	}
	return v, nil
}

// errNoClientShare: see Bucket.Flush.
var errNoClientShare = fmt.Errorf("leakybucket: %w: Windows keeps no per-client counts when every rule is per-resource, so Flush cannot tell a client's share: use FlushAll", errors.ErrUnsupported)

// flush deletes the client's hash and takes its share out of the
// resource's with discounts, in the resource hash's incarnation as read:
// if the hash was deleted meanwhile, the discounts apply to nothing.
func (s windowsStore) flush(ctx context.Context, at site, client string) error {
	if !s.hasClientRule {
		return errNoClientShare
	}
	keys := s.hashes(at.keys, client)
	reads := make([]*redis.MapStringStringCmd, len(keys))
	var clock *redis.TimeCmd
	_, err := at.node.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, key := range keys {
			reads[i] = pipe.HGetAll(ctx, key)
		}
		clock = pipe.Time(ctx)
		return nil
	})
	if err != nil {
		return err
	}
	now := clock.Val().UnixMilli()
	mine := &hash{}
	mine.parse(s, now, reads[len(reads)-1].Val())
	_, err = at.node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, keys[len(keys)-1])
		if s.clientScoped {
			return nil
		}
		inc := reads[0].Val()[incarnation]
		if inc == "" {
			return nil
		}
		share := append(mine.entries, logEntry{id: strconv.FormatInt(now/s.precision, 10), weight: mine.current})
		for _, e := range share {
			index, _ := strconv.ParseInt(e.id, 10, 64)
			if e.weight > 0 {
				pipe.HIncrBy(ctx, keys[0], discountField(index, inc), int64(e.weight))
			}
		}
		pipe.PExpireAt(ctx, keys[0], time.UnixMilli(s.stamp(now)+s.longest))
		return nil
	})
	return err
}

// flushAll deletes the resource's hash, and every client's that SCAN
// finds when a rule is per-client.
func (s windowsStore) flushAll(ctx context.Context, at site) error {
	if s.hasClientRule {
		return deleteUnder(ctx, at, at.keys.hash(), s.scanCount)
	}
	return at.node.Del(ctx, at.keys.hash()).Err()
}

// tag carries the precision too: hashes of different precisions number
// their intervals differently.
func (s windowsStore) tag() string {
	return "w" + strconv.FormatInt(s.longest, 10) + "p" + strconv.FormatInt(s.precision, 10)
}
