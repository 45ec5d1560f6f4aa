package inflight

import (
	"context"
	"time"

	"github.com/leakybucket/leakybucket/internal/txn"
)

// An attempt is one acquisition's transaction (see docs/inflight.md):
//
//	TIME
//	per set:  ZREMRANGEBYSCORE set -inf (now          the expired leases
//	          ZRANGE set 0 0 WITHSCORES               the earliest deadline
//	          ZCARD set                               the room before it writes
//	the line: ZREMRANGEBYSCORE qd -inf (now; [ZADD qd life ticket];
//	          ZINTERSTORE q 2 q qd WEIGHTS 1 0; [ZADD q GT arrival ticket]
//	          [ZADD qn weight ticket]; ZINTERSTORE qn 2 qn qd WEIGHTS 1 0
//	          PEXPIREAT q, qd, qn; ZRANGE q, qn 0 -1 WITHSCORES  the line, and its weights
//	if it writes, per set:
//	          ZADD set 2^52 m1..mn                    pending: ranked last
//	          ZREMRANGEBYRANK set limit -1            the cap: only ours go
//	          ZADD set XX deadline m1..mn             the kept get their deadline
//	          PEXPIREAT set deadline+1s NX; ... GT
//
// It is admitted if the cap removed none of its members in any set and
// the room it found fits the weights of the tickets ahead of it in line
// beside its own (without a ticket: of every ticket); else its kept
// members are taken back. An admitted waiter's ticket leaves the
// line in a transaction of its own, which tells the next one.
type attempt struct {
	st       site
	sets     []zset
	le       *Lease
	tk       *ticket
	write    bool
	at       int64 // the stamp: never later than Redis's time (ms)
	deadline int64

	t        *txn.Txn
	time     int
	earliest []int
	held     []int // each set's size before the attempt writes
	line     lineReplies
	capped   []int
}

// attemptResult is what an attempt learned.
type attemptResult struct {
	admitted    bool
	head        string  // the first ticket in line, "" if none
	next        string  // the ticket after the attempt's, "" if none
	nextArrival float64 // next's arrival, +Inf if none
	earliest    int64   // the earliest deadline held, 0 if none
	room        int     // the weight that fitted under every limit before the attempt wrote
	ahead       int     // the weight the tickets ahead of the attempt's ask for (every ticket's, without one)
	line        line    // the line it saw
	now         int64   // Redis's time (ms)
}

func (r *remote) newAttempt(st site, le *Lease, tk *ticket, write bool, at int64, msg attemptMsg) *attempt {
	a := &attempt{st: st, le: le, tk: tk, write: write, at: at, deadline: at + le.ttl.Milliseconds(), t: txn.New(zeroSpace, false)}
	t := a.t
	a.time = t.Add("time")
	sets := r.sets(st.space, le.client)
	a.sets = sets
	for _, z := range sets {
		t.Add("zremrangebyscore", z.key, "-inf", "("+itoa(at))
		a.earliest = append(a.earliest, t.Add("zrange", z.key, 0, 0, "withscores"))
		a.held = append(a.held, t.Add("zcard", z.key))
	}
	var life int64
	if tk != nil {
		life = tk.life(at)
	}
	a.line = pruneTickets(t, st.space, at, tk, life)
	// After the reads: its process's view is what they saw, and the
	// messages after this one; every other process's takes a write's
	// weight as taken (a refusal is followed by a take-back, which tells
	// them to look again).
	t.Add("publish", st.space.channel(), msg.String())
	if !write {
		return a
	}
	ms := members(le)
	for _, z := range sets {
		t.Add(zadd(z.key, pending, ms)...)
		a.capped = append(a.capped, t.Add("zremrangebyrank", z.key, z.limit, -1))
		t.Add(zadd(z.key, a.deadline, ms, "xx")...)
		for _, c := range txn.ExtendTo(z.key, a.deadline+keyLife.Milliseconds()) {
			t.Add(c...)
		}
	}
	return a
}

// zadd is ZADD key [flags...] with every member ms at score.
func zadd(key string, score int64, ms []any, flags ...any) []any {
	cmd := append([]any{"zadd", key}, flags...)
	for _, m := range ms {
		cmd = append(cmd, score, m)
	}
	return cmd
}

// judge reads the replies of a that ran, and says whether, refused, it
// kept members to take back.
func (a *attempt) judge() (attemptResult, bool, error) {
	for _, v := range a.t.Replies {
		if err, ok := v.(error); ok {
			return attemptResult{}, a.write, err // kept, perhaps: take it back
		}
	}
	res := attemptResult{earliest: a.earliestHeld(), room: a.room()}
	l := readLine(a.t, a.line)
	id := ""
	if a.tk != nil {
		id = a.tk.id
	}
	res.line, res.head, res.ahead = l, l.head(), l.ahead(id)
	res.next, res.nextArrival = l.after(id)
	removed := 0
	for _, i := range a.capped {
		removed += int(txn.ReplyInt(a.t.Replies[i]))
	}
	// It takes room only if the room left fits every ticket ahead of it
	// too: it never takes what an earlier waiter needs.
	res.admitted = a.write && removed == 0 && res.room-res.ahead >= a.le.n
	return res, a.write && !res.admitted, nil
}

// room reads the weight that fitted under every limit, before a wrote.
func (a *attempt) room() int {
	room := MaxLimit
	for i, z := range a.sets {
		room = min(room, z.limit-int(txn.ReplyInt(a.t.Replies[a.held[i]])))
	}
	return room
}

// earliestHeld reads the earliest deadline held in any set (0 if none).
func (a *attempt) earliestHeld() int64 {
	var earliest int64
	for _, i := range a.earliest {
		if s := txn.ReplyScores(a.t.Replies[i]); len(s) > 0 && (earliest == 0 || int64(s[0]) < earliest) {
			earliest = int64(s[0])
		}
	}
	return earliest
}

// lostAttempt is what to do once a's caller has its answer without a's
// reply: the members it may have written must not stay held. One that
// ran after its caller left is taken back at once, as waiters that give
// up leave often under contention, and every member left behind refuses
// others; one whose reply was lost, once Redis has run what it read. An
// attempt that only looks wrote none.
func (r *remote) lostAttempt(a *attempt) func(ran bool) {
	if !a.write {
		return nil
	}
	return func(ran bool) {
		if !ran {
			a.t.Resolve(a.st.node, false)
		}
		r.takeBack(a.le, true)
	}
}

// graced returns the context an attempt runs on: ctx, or, for one that
// writes, one that outlives ctx's deadline by c.grace (see AcquireWithin).
func graced(ctx context.Context, c call, write bool) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !write || c.grace <= 0 || !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline.Add(c.grace))
}

// attempt makes one attempt, with a lease of its own, and takes back
// what it kept if refused: the lease is returned if admitted. Each
// attempt's lease has a token of its own, so that a take-back still
// under way never removes a later attempt's members.
func (r *remote) attempt(ctx context.Context, c call, tk *ticket, write bool) (*Lease, attemptResult, error) {
	le := newLease(nil, c)
	st, err := r.siteOf(ctx, le.resource)
	if err != nil {
		return nil, attemptResult{}, err
	}
	at, err := st.stamp(ctx)
	if err != nil {
		return nil, attemptResult{}, st.settle(ctx, err)
	}
	msg := attemptMsg{from: r.wakes.id}
	if write {
		msg.n = c.n
	}
	if tk != nil {
		msg.seq = r.wakes.looking(st.channel())
	}
	a := r.newAttempt(st, le, tk, write, at, msg)
	rctx, cancel := graced(ctx, c, write)
	defer cancel()
	sent := time.Now()
	out, err := st.run(rctx, a.t, r.lostAttempt(a))
	if out != txn.Ran {
		return nil, attemptResult{}, st.settle(ctx, err)
	}
	res, kept, err := a.judge()
	if err == nil {
		res.now, _ = st.sample(a.t.Replies[a.time], sent)
	}
	if kept {
		r.takeBackNow(ctx, le)
	}
	if err != nil {
		return nil, res, classify(err)
	}
	if !res.admitted {
		return nil, res, nil
	}
	le.deadline = time.UnixMilli(a.deadline)
	return le, res, nil
}
