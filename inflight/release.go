package inflight

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// release removes le's members from every set, and tells the first
// waiter:
//
//	TIME; ZSCORE set m0; per set: ZREM set m1..mn; PUBLISH wake n
//
// ZREM is idempotent: released twice, or after an expiry, nothing is
// freed twice. ZSCORE, read before, says whether it was held, and TIME
// whether its deadline had passed.
func (r *remote) release(ctx context.Context, le *Lease) error {
	st, err := r.siteOf(ctx, le.resource)
	if err != nil {
		return err
	}
	sets := r.sets(st.space, le.client)
	ms := members(le)
	t := txn.New(zeroSpace, false)
	now := t.Add("time")
	score := t.Add("zscore", sets[0].key, ms[0])
	for _, z := range sets {
		t.Add(append([]any{"zrem", z.key}, ms...)...)
	}
	t.Add("publish", st.channel(), strconv.Itoa(le.n)) // the weight freed: each waiter in line reckons whether it fits now
	sent := time.Now()
	if out, err := st.run(ctx, t, nil); out != txn.Ran {
		return st.settle(ctx, err)
	}
	redisNow, _ := st.sample(t.Replies[now], sent)
	deadline, held := replyScore(t.Replies[score])
	switch {
	case !held:
		return lost(le, time.UnixMilli(redisNow))
	case int64(deadline) < redisNow:
		return fmt.Errorf("%w: %s (deadline %s)", ErrExpired, le.ID(), time.UnixMilli(int64(deadline)).UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// extend moves le's deadline later in every set where it is still held:
//
//	TIME; per set: ZREMRANGEBYSCORE set -inf (now; ZADD set XX GT deadline m1..mn;
//	PEXPIREAT ...; ZSCORE set m0
//
// XX never revives a lease trimmed as expired; a lease found in some set
// only is lost, and removed from the rest.
func (r *remote) extend(ctx context.Context, le *Lease, ttl time.Duration) error {
	st, err := r.siteOf(ctx, le.resource)
	if err != nil {
		return err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return st.settle(ctx, err)
	}
	deadline := at + ttl.Milliseconds()
	sets := r.sets(st.space, le.client)
	ms := members(le)
	t := txn.New(zeroSpace, false)
	now := t.Add("time")
	var scores []int
	for _, z := range sets {
		t.Add("zremrangebyscore", z.key, "-inf", "("+itoa(at))
		t.Add(zadd(z.key, deadline, ms, "xx", "gt")...)
		for _, c := range txn.ExtendTo(z.key, deadline+keyLife.Milliseconds()) {
			t.Add(c...)
		}
		scores = append(scores, t.Add("zscore", z.key, ms[0]))
	}
	sent := time.Now()
	if out, err := st.run(ctx, t, nil); out != txn.Ran {
		return st.settle(ctx, err)
	}
	redisNow, _ := st.sample(t.Replies[now], sent)
	for _, i := range scores {
		if _, ok := replyScore(t.Replies[i]); !ok {
			go r.takeBack(le, true)
			return lost(le, time.UnixMilli(redisNow))
		}
	}
	le.setDeadline(time.UnixMilli(deadline))
	return nil
}

// held reads the resource's set (a per-resource limit's; else the
// leases are listed per client, which Held does not scan for) and its
// line.
func (r *remote) held(ctx context.Context, resource string) (Usage, error) {
	u := Usage{Limit: r.cfg.resourceLimit}
	if r.cfg.resourceLimit == 0 {
		return u, nil
	}
	st, err := r.siteOf(ctx, resource)
	if err != nil {
		return u, err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return u, st.settle(ctx, err)
	}
	key := r.sets(st.space, "")[0].key
	pipe := st.node.Pipeline()
	leases := pipe.ZRangeByScoreWithScores(ctx, key, &redis.ZRangeBy{Min: itoa(at), Max: "+inf"})
	waiters := pipe.ZCount(ctx, st.queueLife(), itoa(at), "+inf")
	err, ok := await(ctx, st, func() error { _, err := pipe.Exec(ctx); return err }, nil)
	if !ok {
		err = st.cutShort(ctx)
	}
	if err != nil {
		return u, st.settle(ctx, err)
	}
	byID := map[string]*Holder{}
	for _, z := range leases.Val() {
		h, ok := holderOf(resource, fmt.Sprint(z.Member), int64(z.Score))
		if !ok {
			continue
		}
		if byID[h.ID] == nil {
			byID[h.ID] = &h
			u.Holders = append(u.Holders, h)
			u.Held += h.Weight
		}
	}
	u.Waiters = int(waiters.Val()) + r.wakes.behind(st.channel())
	slices.SortFunc(u.Holders, func(a, b Holder) int { return a.Deadline.Compare(b.Deadline) })
	return u, nil
}

// holderOf reads a member's name (C.T.n.i).
func holderOf(resource, member string, deadline int64) (Holder, bool) {
	parts := strings.Split(member, ".")
	if len(parts) != 4 {
		return Holder{}, false
	}
	le, err := ParseID(keys.Encode(resource) + "." + strings.Join(parts[:3], "."))
	if err != nil {
		return Holder{}, false
	}
	if _, err := strconv.Atoi(parts[3]); err != nil {
		return Holder{}, false
	}
	return Holder{Client: le.client, ID: le.ID(), Weight: le.n, Deadline: time.UnixMilli(deadline)}, true
}
