package store

import (
	"context"
	"math"

	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// The calls that the bound of a batch's epochs left undecided
// (limits.View.Undecided: written, and read far, but the bound leaves less
// than a margin beside them) are decided on a whole read, where they
// stand: their weight written already, by the batch's transaction.

// pendingCall is a call of a batch left undecided: its index, and what
// the batch's transaction read for it.
type pendingCall struct {
	i    int
	view limits.View
}

// confirmation is the whole read of a batch's pending calls' hashes, in a
// transaction of its own, after the batch's.
type confirmation struct {
	b        *hBatch
	whole    map[*hash]*hash // by the batch's hash: its read
	order    []*hash         // the batch's hashes read, in order
	genReply int
	clock    int
}

// confirm decides the batch's pending calls, in order, on a whole read of
// their hashes at Redis's time when it runs, each counted where its
// weight lies (where the batch wrote it, or moved it: see hBatch.early):
// as if it had come after the batch's other calls. Those it admits stay,
// those it denies are taken back, under the guards of the batch's
// hashes. If it cannot (its reply lost, a FlushAll, or Redis's time in an
// epoch or a fixed window the read does not serve), each is evaluated on
// what the batch's transaction read, which leaves it undecided: it is
// then taken back at once, and decided again by the Bucket.
func (b *hBatch) confirm(ctx context.Context, where Site, evaluate Evaluate) {
	back := txn.New(b.keys, true)
	estimate, err := where.Clock.Estimate(ctx, where.Node)
	c := &confirmation{b: b, whole: map[*hash]*hash{}}
	t := txn.New(b.keys, false) // it writes nothing: no marker
	if err == nil {
		c.queue(t, estimate)
		_, err = t.Exec(ctx, where.Node)
	}
	if err != nil || !c.conclude(t, evaluate, back) {
		for _, p := range b.pending {
			evaluate(p.i, p.view)
		}
		b.queueBack(back, func(h *hash) int { return h.pending })
		back.Urgent = true
	}
	handOn(where, back, false)
}

// queue adds the reads of the pending calls' hashes, whole, around the
// estimate of Redis's time: its epoch, the one before and the one after.
func (c *confirmation) queue(t *txn.Txn, estimate int64) {
	c.genReply, c.clock = t.Add("get", c.b.keys.Generation()), t.Add("time")
	for _, h := range c.b.order {
		if h.pending == 0 {
			continue
		}
		read := c.b.windowsStore.newHash(h.scope, h.client, estimate, around)
		read.whole, read.added = true, h.pending
		c.b.queueWhole(t, read)
		c.whole[h] = read
		c.order = append(c.order, h)
	}
}

// conclude evaluates the pending calls on t's replies, queues on back the
// take-back of those denied, and reports whether it could.
func (c *confirmation) conclude(t *txn.Txn, evaluate Evaluate, back *txn.Txn) bool {
	b := c.b
	server, ok := txn.ReplyTime(t.Replies[c.clock])
	now := server.UnixMilli()
	if seen, _ := t.Replies[c.genReply].(string); !ok || seen != b.gen || !c.serves(now) {
		return false
	}
	for _, h := range c.order {
		c.read(h, t.Replies)
	}
	for _, p := range b.pending {
		c.evaluateCall(p.i, evaluate, now)
	}
	b.queueBack(back, func(h *hash) int {
		if read := c.whole[h]; read != nil {
			return read.denied
		}
		return 0
	})
	return true
}

// read reads the whole read of h, one of the batch's hashes, from replies:
// every interval, but the pending calls' weight where it lies (at the
// stamp, or moved: see hBatch.at).
func (c *confirmation) read(h *hash, replies []any) {
	b, read := c.b, c.whole[h]
	b.readAt(read, replies, func(int) int64 { return math.MinInt64 }) // no interval is current: each is a lane's
	for g, span := range b.Spans {
		for _, l := range b.LanesOf[g] {
			read.lanes[l] = withWeight(read.lanes[l], b.Lanes[l].At(b.at(g, b.ran)/span), -h.pending)
		}
	}
}

// evaluateCall asks evaluate about pending call i, at now, on the whole read
// with the pending calls evaluated before it, counted where the batch wrote
// them.
func (c *confirmation) evaluateCall(i int, evaluate Evaluate, now int64) {
	b, hashes := c.b, c.b.hashesOf(i)
	v := limits.View{Now: now, Counts: make([]limits.Count, len(b.Rules))}
	for r, rule := range b.Rules {
		v.Counts[r] = b.count(c.whole[hashes[b.hashOf(rule)]], r, rule, b.at(b.Lane(r).Group, b.ran), now)
	}
	call := b.calls[i]
	kept := keptOf(call, b.Rules, v, evaluate(i, v))
	for _, h := range hashes {
		c.whole[h].admitted += kept
		c.whole[h].denied += call.N - kept
	}
}

// serves reports whether the read serves a judgment at now: now's epoch
// and the one before read, holding the pending weight, and no fixed
// window of the pending calls ended.
func (c *confirmation) serves(now int64) bool {
	b := c.b
	for _, h := range c.order {
		read := c.whole[h]
		for g := range read.parts {
			written := b.Epoch(g, b.at(g, b.ran))
			fixed, _ := b.Kinds(g)
			if fixed && b.late(g, now) || !b.covers(read, now) || written < b.Epoch(g, now)-1 {
				return false
			}
		}
	}
	return true
}
