package inflight

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// remote keeps leases in Redis. For prefix P, resource r and client c (R
// and C their base64url encodings), limit L and a lease's random token T
// of weight n:
//
//	P:{R}:if:r:L      the resource's leases: one member C.T.n.i per unit i of weight,
//	                  scored by the lease's deadline (Redis ms)
//	P:{R}:if:c:L:C    the same, for client c's limit
//	P:{R}:if:q        one ticket per process with waiters, scored by its first waiter's arrival
//	P:{R}:if:qd       the same tickets, scored by the deadline of that waiter's last sign of life
//	P:{R}:if:wake     the channel on which a waiter is told that its turn came
//
// The hash tag {R} puts every key of a call in one cluster slot.
type remote struct {
	cfg      config
	node     func(ctx context.Context, key string) (*redis.Client, error)
	clocks   clock.Set
	breakers breaker.Breakers
	wakes    *wakes
}

func newRemote(rdb redis.UniversalClient, cfg config) (*remote, error) {
	var node func(context.Context, string) (*redis.Client, error)
	switch c := rdb.(type) {
	case *redis.Client:
		if c != nil {
			node = func(context.Context, string) (*redis.Client, error) { return c, nil }
		}
	case *redis.ClusterClient:
		if c != nil {
			node = c.MasterForKey
		}
	case *redis.Ring:
		if c != nil {
			node = func(_ context.Context, key string) (*redis.Client, error) { return c.GetShardClientForKey(key) }
		}
	}
	if node == nil {
		return nil, ErrUnsupportedClient
	}
	return &remote{cfg: cfg, node: node, wakes: newWakes(rdb)}, nil
}

// pending scores a newcomer's members above any deadline, so that they
// rank last and the cap removes only them.
const pending = 1 << 52

// keyLife is how long a set or queue outlives the latest deadline in it.
const keyLife = time.Second

// A ticket is a process's place in Redis's line, as its first waiter
// holds it.
type ticket struct {
	id      string
	arrival float64   // its place in line: see arrivals
	weight  int       // the weight its waiter asks for: room the waiters behind it leave
	until   time.Time // the waiter's deadline (zero if none): its ticket lives no longer
}

// life is when tk stops counting unless its waiter looks again, for an
// attempt stamped at: ticketTTL later, or at its waiter's deadline, so
// that a waiter that gives up holds up no one even before it leaves.
func (tk *ticket) life(at int64) int64 {
	d := ticketTTL
	if !tk.until.IsZero() {
		d = min(d, max(time.Until(tk.until), time.Millisecond))
	}
	return at + d.Milliseconds()
}

// Ticket timing: a waiter signs of life at least every ticketRefresh; a
// ticket whose waiter has not for ticketTTL (a crashed process) is dropped
// by the next call that looks, so a dead waiter holds up the line for at
// most ticketTTL.
const (
	ticketTTL     = 2 * time.Second
	ticketRefresh = ticketTTL / 4
)

// space is the keys of one resource.
type space struct{ base string }

func (r *remote) spaceOf(resource string) space {
	return space{base: keys.Of(r.cfg.prefix, resource).Slot() + "if:"}
}

func (s space) queue() string     { return s.base + "q" }
func (s space) queueLife() string { return s.base + "qd" }

// queueWeight is the line's weights: each ticket scored by its waiter's.
func (s space) queueWeight() string { return s.base + "qn" }
func (s space) channel() string     { return s.base + "wake" }

// zset is one limit's sorted set.
type zset struct {
	key   string
	limit int
}

// sets returns the sets of the limits that apply to client at s.
func (r *remote) sets(s space, client string) []zset {
	var out []zset
	if r.cfg.resourceLimit > 0 {
		out = append(out, zset{key: s.base + "r:" + strconv.Itoa(r.cfg.resourceLimit), limit: r.cfg.resourceLimit})
	}
	if r.cfg.clientLimit > 0 {
		out = append(out, zset{key: s.base + "c:" + strconv.Itoa(r.cfg.clientLimit) + ":" + keys.Encode(client), limit: r.cfg.clientLimit})
	}
	return out
}

// members are le's members, one per unit of weight.
func members(le *Lease) []any {
	out := make([]any, le.n)
	head := keys.Encode(le.client) + "." + le.token + "." + strconv.Itoa(le.n) + "."
	for i := range out {
		out[i] = head + strconv.Itoa(i)
	}
	return out
}

// site is where a resource's keys live, and the clock of that server.
type site struct {
	space
	node  *redis.Client
	clock *clock.Clock
	br    *breaker.Breaker
	cut   <-chan struct{} // closed when br opens: the server was found gone
}

// siteOf finds resource's server, and refuses at once while its breaker
// is open.
func (r *remote) siteOf(ctx context.Context, resource string) (site, error) {
	s := r.spaceOf(resource)
	node, err := r.node(ctx, s.base)
	if err != nil {
		return site{}, classify(err)
	}
	br := r.breakers.Of(node)
	cut := br.Watch() // before Admit: an opening in between cuts the call
	if err := br.Admit(); err != nil {
		return site{}, err
	}
	return site{space: s, node: node, clock: r.clocks.Of(node.Options().Addr), br: br, cut: cut}, nil
}

// await runs f in the background and returns its result, as the Bucket
// waits for a decision (see package breaker): once it has waited
// SuspectAfter, the breaker's probe looks whether the server is gone
// (with its default options go-redis retries a refused dial for hundreds
// of milliseconds, the probe's is refused at once); should ctx end, or
// the breaker open, first, it returns false at once, and late, if not
// nil, gets f's result once it comes.
func await[T any](ctx context.Context, st site, f func() T, late func(T)) (T, bool) {
	defer st.br.Suspecting()()
	done := make(chan T, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v, true
	case <-ctx.Done():
	case <-st.cut:
	}
	select {
	case v := <-done:
		return v, true // it ended meanwhile
	default:
	}
	if late != nil {
		go func() { late(<-done) }()
	}
	var zero T
	return zero, false
}

// cutShort is the error of a call that await gave up on: ctx's, or the
// open breaker's (ErrUnavailable with the cause the probe found).
func (st site) cutShort(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return st.br.Refusal()
}

// settle is what a call that ended with err returns, and feeds the
// breaker: an unreachable server opens it, a call that ran out of time
// (its context ended, or a dial or read reached the context's deadline
// first) makes its probe look.
func (st site) settle(ctx context.Context, err error) error {
	if err == nil || breaker.Refused(err) {
		return err
	}
	if late := outOfTime(ctx, err); late != nil {
		return st.br.Late(late)
	}
	if breaker.Gone(err) {
		err = classify(err)
		st.br.Open(err)
		return err
	}
	return classify(err)
}

// outOfTime returns err, which is not nil, as the error of a call that
// ran out of time, if it is one: ctx's own end, or a dial or read that
// reached ctx's deadline first (a net timeout, which matches no context
// error), as context.DeadlineExceeded with its cause. It returns nil for
// any other error. A wait that runs out is no outage: Redis was reached,
// only later than the caller would wait.
func outOfTime(ctx context.Context, err error) error {
	deadline, ok := ctx.Deadline()
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return err
	case ctx.Err() != nil || (ok && !time.Now().Before(deadline)):
		return fmt.Errorf("%w: %w", context.DeadlineExceeded, classify(err))
	}
	return nil
}

func classify(err error) error {
	switch {
	case err == nil, errors.Is(err, ErrUnavailable):
		return err
	case breaker.Unreachable(err):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case strings.HasPrefix(err.Error(), "inflight: "):
		return err
	}
	return fmt.Errorf("inflight: %w", err)
}

// run sends t on st's node, and returns by ctx's end, or the breaker's
// opening, whatever Redis does (see await): a transaction still under
// way then goes on in the background, and undo, if not nil, is called
// once it ends unanswered: ran is true if its reply came after its caller
// had left (what it wrote is there now), false if the reply was lost (it
// may run yet).
func (st site) run(ctx context.Context, t *txn.Txn, undo func(ran bool)) (txn.Outcome, error) {
	type result struct {
		out txn.Outcome
		err error
	}
	res, ok := await(ctx, st, func() result {
		out, err := t.Exec(context.WithoutCancel(ctx), st.node)
		if out == txn.Unknown && undo != nil {
			go undo(false)
		}
		return result{out, err}
	}, func(res result) {
		// Its own goroutine calls undo if the reply is lost, and one whose
		// reply comes is undone at once: its caller has gone.
		if res.out == txn.Ran && undo != nil {
			undo(true)
		}
	})
	if !ok {
		return txn.Unknown, st.cutShort(ctx)
	}
	return res.out, res.err
}

// stamp returns the server's time, never later than it (ms): the
// clock's estimate, or, until it has one, a TIME round trip that await
// bounds (the first call to a server never started must not wait out
// go-redis's dial retries).
func (st site) stamp(ctx context.Context) (int64, error) {
	if now, ok := st.clock.Earliest(); ok {
		return now, nil
	}
	type result struct {
		at  int64
		err error
	}
	res, ok := await(ctx, st, func() result {
		at, err := st.clock.Estimate(ctx, st.node)
		return result{at, err}
	}, nil)
	if !ok {
		return 0, st.cutShort(ctx)
	}
	return res.at, res.err
}

// sample feeds the clock the TIME reply of a transaction sent at sent.
func (st site) sample(v any, sent time.Time) (int64, bool) {
	t, ok := txn.ReplyTime(v)
	if ok {
		st.clock.Sample(t, sent)
	}
	return t.UnixMilli(), ok
}

// replyScore reads a ZSCORE reply: false if there is none.
func replyScore(v any) (float64, bool) {
	switch f := v.(type) {
	case float64:
		return f, true
	case string:
		x, err := strconv.ParseFloat(f, 64)
		return x, err == nil
	case int64:
		return float64(f), true
	}
	return 0, false
}

// pruneTickets queues the commands that drop the tickets of waiters not
// seen alive since at, and (re)register tk's if not nil, alive until
// life, with its weight; it returns where the replies naming the line
// are.
func pruneTickets(t *txn.Txn, s space, at int64, tk *ticket, life int64) lineReplies {
	t.Add("zremrangebyscore", s.queueLife(), "-inf", "("+strconv.FormatInt(at, 10))
	if tk != nil {
		t.Add("zadd", s.queueLife(), life, tk.id)
		t.Add("zadd", s.queueWeight(), tk.weight, tk.id)
	}
	for _, k := range []string{s.queue(), s.queueWeight()} {
		t.Add("zinterstore", k, 2, k, s.queueLife(), "weights", 1, 0)
	}
	if tk != nil {
		t.Add("zadd", s.queue(), "gt", tk.arrival, tk.id)
	}
	// ZINTERSTORE made q and qn anew, without a deadline: every ticket in
	// them lives at most ticketTTL past a stamp no later than Redis's time.
	for _, k := range []string{s.queue(), s.queueLife(), s.queueWeight()} {
		for _, c := range txn.ExtendTo(k, max(life, at+ticketTTL.Milliseconds())+keyLife.Milliseconds()) {
			t.Add(c...)
		}
	}
	return lineReplies{
		order:   t.Add("zrange", s.queue(), 0, -1, "withscores"),
		weights: t.Add("zrange", s.queueWeight(), 0, -1, "withscores"),
	}
}

// lineReplies is where a transaction's replies name the line: its
// tickets in order of arrival, and their weights.
type lineReplies struct{ order, weights int }

// A line is Redis's line as a transaction saw it.
type line struct {
	ids      []string
	arrivals []float64
	weights  map[string]int
}

// readLine reads the line from t's replies at at.
func readLine(t *txn.Txn, at lineReplies) line {
	ids, arrivals := replyPairs(t.Replies[at.order])
	names, ws := replyPairs(t.Replies[at.weights])
	l := line{ids: ids, arrivals: arrivals, weights: map[string]int{}}
	for i, n := range names {
		l.weights[n] = int(ws[i])
	}
	return l
}

// replyPairs reads a ZRANGE WITHSCORES reply, in RESP2 or RESP3.
func replyPairs(v any) (names []string, scores []float64) {
	items, _ := v.([]any)
	for i := 0; i < len(items); i++ {
		if pair, ok := items[i].([]any); ok && len(pair) == 2 { // RESP3: [member, score]
			names = append(names, txn.ReplyString(pair[0]))
			continue
		}
		names = append(names, txn.ReplyString(items[i])) // RESP2: member, score, ...
		i++
	}
	return names, txn.ReplyScores(items)
}

// head is the first ticket in line, "" if none.
func (l line) head() string {
	if len(l.ids) == 0 {
		return ""
	}
	return l.ids[0]
}

// after returns the ticket after id in line and its arrival ("" and +Inf
// if none).
func (l line) after(id string) (string, float64) {
	if i := slices.Index(l.ids, id); i >= 0 && i+1 < len(l.ids) {
		return l.ids[i+1], l.arrivals[i+1]
	}
	return "", math.Inf(1)
}

// ahead is the weight the tickets ahead of id ask for: every ticket's, if
// id is not in line.
func (l line) ahead(id string) int {
	sum := 0
	for _, other := range l.ids {
		if other == id {
			break
		}
		sum += l.weights[other]
	}
	return sum
}

// takeBack removes le's members from every set, and tells every waiter
// in line, if tell, that the line moved (room may have come): in a
// transaction of its own, detached from any caller, tried again until it
// runs or retryFor passes (the members expire at their deadline anyway).
func (r *remote) takeBack(le *Lease, tell bool) {
	ctx, cancel := context.WithTimeout(context.Background(), retryFor)
	defer cancel()
	backoff.New(txn.ResolveFirstBackoff, txn.ResolveMaxBackoff).Retry(ctx, func() bool {
		return r.takeBackOnce(ctx, le, tell)
	})
}

// takeBackOnce makes one attempt of takeBack, and reports whether it ran.
func (r *remote) takeBackOnce(ctx context.Context, le *Lease, tell bool) bool {
	st, err := r.siteOf(ctx, le.resource)
	if err != nil {
		return false
	}
	u := undo{lease: le}
	if tell {
		u.tell = takenBack
	}
	return r.undo(ctx, st, u) == nil
}

// takeBackNow takes le back before its caller is answered, as others
// may be refused while it is counted: once, within a second, and else in
// the background.
func (r *remote) takeBackNow(ctx context.Context, le *Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if r.takeBackOnce(ctx, le, true) {
		return
	}
	go r.takeBack(le, true)
}

// retryFor bounds how long a take-back is tried in the background.
const retryFor = 10 * time.Second

// undo is what a transaction of undo takes back: a lease's members, a
// ticket out of line (drop), or a process's ticket passed to its next
// waiter (pass: scored by that one's arrival and weight, alive until its
// life); tell, if not "", is the message that tells every waiter in line.
type undo struct {
	lease *Lease
	drop  string
	pass  *ticket
	tell  string
}

// undo runs u.
func (r *remote) undo(ctx context.Context, st site, u undo) error {
	at, err := st.stamp(ctx)
	if err != nil {
		return err
	}
	t := txn.New(zeroSpace, false)
	if u.lease != nil {
		ms := members(u.lease)
		for _, z := range r.sets(st.space, u.lease.client) {
			t.Add(append([]any{"zrem", z.key}, ms...)...)
		}
	}
	if u.drop != "" {
		for _, k := range []string{st.queue(), st.queueLife(), st.queueWeight()} {
			t.Add("zrem", k, u.drop)
		}
	}
	life := int64(0)
	if u.pass != nil {
		life = u.pass.life(at)
		t.Add("zadd", st.queueLife(), "xx", life, u.pass.id)
		t.Add("zadd", st.queueWeight(), "xx", u.pass.weight, u.pass.id)
		t.Add("zadd", st.queue(), "xx", "gt", u.pass.arrival, u.pass.id)
	}
	pruneTickets(t, st.space, at, nil, life)
	if u.tell != "" {
		t.Add("publish", st.channel(), u.tell)
	}
	out, err := t.Exec(ctx, st.node)
	if out != txn.Ran {
		return err // ZREM and ZADD are idempotent: simply try again
	}
	return nil
}

var zeroSpace keys.Space

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// arrivals numbers this process's waiters in the order they arrive. A
// ticket is scored by the Redis time of its waiter's arrival, in ms to
// the microsecond (the clock's estimate): two waiters of one process that
// arrive within the same microsecond, or across a correction of the
// clock's estimate, would tie or swap, and a tie is broken by the
// tickets' random ids, so the later one would pass the earlier one half
// the time. So each score is at least the one before it plus
// arrivalStep: a fraction of a millisecond, on the same scale as every
// other process's scores.
type arrivals struct {
	mu   sync.Mutex
	last float64
}

// arrivalStep is the least gap between two arrivals of one process, in
// ms: about a microsecond, far above a float64's resolution at today's
// Redis time in ms (41 bits), so that every step is kept.
const arrivalStep = 1.0 / 1024

// next returns the score of a waiter whose first attempt was stamped at
// (Redis ms): after every earlier arrival of this process, and no earlier
// than at.
func (a *arrivals) next(at float64) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.last = max(at, a.last+arrivalStep)
	return a.last
}
