package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// What Windows reads and deletes beside its decisions: Peek, Flush and
// FlushAll.

// around is the reach of a read that does not know Redis's time yet: the
// epoch after the estimate's too, which Redis's time may be in.
func around(int) int64 { return 1 }

// read reads the generation, the whole hashes of client around the
// estimate of Redis's time, and TIME, on conn in one round trip; again
// (paced by a redoPace, until ctx ends) if the generation was not the
// one expected, or if Redis's time was in an epoch whose windows reach
// one it did not read.
func (s windowsStore) read(ctx context.Context, conn pipeliner, where Site, client string) (int64, []*hash, error) {
	ks := where.Keys
	for again := newRedoPace(); ; {
		estimate, err := where.Clock.Estimate(ctx, where.Node)
		if err != nil {
			return 0, nil, err
		}
		gen := s.gen(ks)
		scopes := s.scopes(ks, gen, client)
		reads := txn.New(ks, false) // a list of commands, sent in a plain pipeline
		seen := reads.Add("get", ks.Generation())
		hashes := make([]*hash, len(scopes))
		for i, scope := range scopes {
			hashes[i] = s.newHash(scope, false, estimate, around)
			hashes[i].whole = true
			s.queueWhole(reads, hashes[i])
		}
		timeAt := reads.Add("time")
		sent, replies, err := pipelined(ctx, conn, reads.Cmds)
		if err != nil {
			return 0, nil, err
		}
		server, _ := txn.ReplyTime(replies[timeAt])
		if stale := s.stale(where, gen, replies[seen], hashes[0], server); stale != nil {
			if err := again.wait(ctx, stale); err != nil {
				return 0, nil, err
			}
			continue
		}
		where.Clock.Sample(server, sent)
		now := server.UnixMilli()
		for _, h := range hashes {
			s.readAt(h, replies, func(int) int64 { return now })
		}
		return now, hashes, nil
	}
}

// stale says why a read of the hashes of generation gen, around h, which
// Redis ran at server, must be made again, if it must: a FlushAll ended
// the generation (errStaleGeneration, seen in the generation's reply), or
// Redis's time was in an epoch whose windows reach one it did not read
// (errUnread: the estimate was off, and is made anew).
func (s windowsStore) stale(where Site, gen string, seen any, h *hash, server time.Time) error {
	switch {
	case !s.saw(where.Keys, gen, seen):
		return errStaleGeneration
	case !s.covers(h, server.UnixMilli()):
		where.Clock.Reset()
		return errUnread
	}
	return nil
}

// queueWhole queues the read of every epoch of h, whole.
func (s windowsStore) queueWhole(t *txn.Txn, h *hash) {
	for g := range h.parts {
		p := &h.parts[g]
		for i, key := range p.keys {
			if key != "" {
				p.read(t, i, readWhole)
			}
		}
	}
}

// covers reports whether h's epochs hold every interval a rule counts at
// now: those of now's epoch and the one before.
func (s windowsStore) covers(h *hash, now int64) bool {
	for g := range h.parts {
		p := &h.parts[g]
		at := s.Epoch(g, now)
		if s.sliding(g) && (at < p.epoch || p.keys[1+at-p.epoch] == "") || !s.sliding(g) && at != p.epoch {
			return false
		}
	}
	return true
}

// pipelined sends cmds in one pipeline on conn, and returns when it sent
// them and their replies (nil for a nil reply).
func pipelined(ctx context.Context, conn pipeliner, cmds [][]any) (sent time.Time, replies []any, err error) {
	sent = time.Now()
	out := make([]*redis.Cmd, len(cmds))
	_, err = conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, args := range cmds {
			out[i] = pipe.Do(ctx, args...)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return sent, nil, err
	}
	replies = make([]any, len(out))
	for i, c := range out {
		replies[i] = c.Val()
	}
	return sent, replies, nil
}

func (s windowsStore) Peek(ctx context.Context, where Site, client string, _ int) (limits.View, error) {
	now, hashes, err := s.read(ctx, where.Node, where, client)
	if err != nil {
		return limits.View{}, err
	}
	v := limits.View{Now: now, Counts: make([]limits.Count, len(s.Rules))}
	for r, rule := range s.Rules {
		v.Counts[r] = s.count(hashes[s.hashOf(rule)], r, rule, now, now)
	}
	return v, nil
}

// ErrNoClientShare: see Bucket.Flush.
var ErrNoClientShare = fmt.Errorf("leakybucket: %w: Windows keeps no per-client counts when every rule is per-resource, so Flush cannot tell a client's share: use FlushAll", errors.ErrUnsupported)

// Flush takes the client's hashes away, in one transaction that reads
// what they held and deletes them, and then takes that share out of the
// resource's hashes, in a second one run exactly once (it is marked, as a
// take-back is). It never fails because the client is busy: no WATCH. A
// decision of the client is in the hashes when they are taken, and then
// taken out of the resource's too, or comes after and makes new ones; a
// take-back of weight that the hashes held when they were taken does
// nothing (see txn.Guard). Between the two transactions the resource counts
// the share still, which errs on the side of denying.
func (s windowsStore) Flush(ctx context.Context, where Site, client string) error {
	if !s.HasClientRule {
		return ErrNoClientShare
	}
	for again := newRedoPace(); ; {
		stale, err := s.flushOnce(ctx, where, client)
		if err != nil || stale == nil {
			return err
		}
		if err := again.wait(ctx, stale); err != nil {
			return err
		}
	}
}

// flushOnce is one attempt of Flush. stale, if not nil, says why it is to
// be made again: a FlushAll came first (errStaleGeneration), or the
// estimate was off by an epoch (errUnread).
func (s windowsStore) flushOnce(ctx context.Context, where Site, client string) (stale, err error) {
	estimate, err := where.Clock.Estimate(ctx, where.Node)
	if err != nil {
		return nil, err
	}
	gen := s.gen(where.Keys)
	scopes := s.scopes(where.Keys, gen, client)
	mine := s.newHash(scopes[len(scopes)-1], true, estimate, around)
	take := txn.New(where.Keys, false)
	s.queueWhole(take, mine)
	for g := range mine.parts {
		for _, key := range mine.parts[g].keys {
			if key != "" {
				take.Add("del", key)
			}
		}
	}
	seen, timeAt := take.Add("get", where.Keys.Generation()), take.Add("time")
	if _, err := take.Exec(ctx, where.Node); err != nil {
		return nil, err
	}
	server, _ := txn.ReplyTime(take.Replies[timeAt])
	stale = s.stale(where, gen, take.Replies[seen], mine, server)
	if !errors.Is(stale, errStaleGeneration) {
		// Taken, and its share with it; if the estimate was off by an
		// epoch (errUnread), the rest next time. After a FlushAll the
		// client's hashes are other ones.
		s.takeShare(where, scopes, mine, take.Replies)
	}
	return stale, nil
}

// takeShare takes what mine's hashes held, as replies show it, out of the
// resource's, if a rule is per-resource.
func (s windowsStore) takeShare(where Site, scopes []string, mine *hash, replies []any) {
	if !s.ClientScoped {
		takeBack(where, s.share(where.Keys, scopes[0], mine, replies), false)
	}
}

// share is the marked transaction that takes what mine's hashes held, as
// replies show it (every interval, and the total), out of the resource's
// hashes of the same epochs, whose names start with resource. An interval
// held what a read counts in it: its field with what the hash's pending
// fields add to it (see txn.Txn.Resend). The resource's hash holds the
// same pending weights, written by the same resends (a client's take-back
// takes from both hashes), which keep counting there: so the resource's
// intervals, as a read counts them, lose exactly what the client's held.
func (s windowsStore) share(ks keys.Space, resource string, mine *hash, replies []any) *txn.Txn {
	t := txn.New(ks, true)
	for g := range mine.parts {
		p := &mine.parts[g]
		for i, read := range p.reads {
			if read < 0 {
				continue
			}
			key, from := keys.Epoch(resource, g, p.epoch-1+int64(i)), len(t.Cmds)
			for field, n := range held(replies[read]) {
				if n != 0 {
					t.Add("hincrby", key, field, -n)
				}
			}
			if len(t.Cmds) > from {
				t.Add(txn.DropIfMade(key)...)
				t.Keep(s.EpochExpireAt(g, p.epoch-1+int64(i)))
			}
		}
	}
	return t
}

// held reads the reply of HGETALL of a hash as the numbers its fields
// hold, each with what the hash's pending fields add to it. A pending
// weight of a field that is not a number's name is not ours.
func held(reply any) map[string]int {
	out := map[string]int{}
	var pending []string
	for field, value := range txn.ReplyFields(reply) {
		if txn.IsPending(field) {
			pending = append(pending, value)
		} else if n, err := strconv.Atoi(value); err == nil {
			out[field] = n
		}
	}
	for _, value := range pending {
		for field, n := range txn.Pending(value) {
			if _, err := strconv.ParseUint(field, 10, 63); err == nil {
				out[field] += n
			}
		}
	}
	return out
}

// FlushAll starts a new generation, and deletes the hashes of the resource
// (with SCAN when a rule is per-client): a decision or take-back that
// raced it writes to the old generation, which nothing reads. When the
// generation's key expires, the names start again from the first
// generation's, so it must outlive every hash that holds an interval some
// rule counts: those written before the flush (Layout.GenLife after it: each
// was written by a call stamped before it) and those of its own generation
// (each decision extends it to its hash's deadline, with GT). It lives no
// longer than that.
func (s windowsStore) FlushAll(ctx context.Context, where Site) error {
	ks, err := s.resourceHashes(ctx, where)
	if err != nil {
		return err
	}
	var bumped *redis.IntCmd
	_, err = where.Node.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		bumped = pipe.Incr(ctx, where.Keys.Generation())
		life := s.GenLife().Milliseconds()
		pipe.Do(ctx, "pexpire", where.Keys.Generation(), life, "nx")
		pipe.Do(ctx, "pexpire", where.Keys.Generation(), life, "gt")
		if len(ks) > 0 {
			pipe.Del(ctx, ks...)
		}
		return nil
	})
	if err != nil {
		return err
	}
	s.gens.Store(where.Keys.Slot(), strconv.FormatInt(bumped.Val(), 10))
	return where.Route.owns(ctx, where.Node, where.Keys)
}

// resourceHashes returns the hashes FlushAll deletes: the resource's
// around the estimate of Redis's time when every rule is per-resource and
// there is one, else every one SCAN finds. Any it misses expires on its
// own: nothing reads it after the new generation.
func (s windowsStore) resourceHashes(ctx context.Context, where Site) ([]string, error) {
	if now, ok := where.Clock.Now(); ok && !s.HasClientRule {
		var out []string
		h := s.newHash(where.Keys.Hash(s.gen(where.Keys)), false, now, around)
		for g := range h.parts {
			for _, key := range h.parts[g].keys {
				if key != "" {
					out = append(out, key)
				}
			}
		}
		return out, nil
	}
	r := newKeyScan(where.Keys.Hashes(), s.ScanCount)
	if err := r.finish(ctx, where.Node); err != nil {
		return nil, err
	}
	return r.found, nil
}
