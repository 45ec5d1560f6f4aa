package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// A round is one lock-free decision of a batch, as SortedSet and Windows
// make it: one MULTI/EXEC (package txn) that records the calls and reads the
// counts, then the calls evaluated in order from what it returned, then, if
// some call was not recorded, a second transaction that takes its writes
// back.
type round interface {
	// queue adds the batch's commands to t.
	queue(t *txn.Txn)
	// conclude reads t's replies, asks evaluate about each call in order, and
	// queues on back the take-back of the calls not recorded. now is Redis's
	// time when t ran (ms), which the Results count from. If it says redo
	// (errRedo), back holds the take-back of what t wrote, if anything.
	conclude(t *txn.Txn, evaluate Evaluate, back *txn.Txn, now int64) error
	// takeAll queues on back the take-back of every call, for a
	// transaction t that ran, although its reply was lost (t.replies is
	// nil: every caller got an error, so none may count) or ran too far
	// from its stamp.
	takeAll(t, back *txn.Txn)
	// idempotent reports whether a take-back may run twice (SortedSet's
	// ZREM) or must run once (Windows' HINCRBY): then the transactions are
	// marked, for resolve to tell whether they ran.
	idempotent() bool
}

// An earlyWriter is a round whose transaction, if Redis ran it at now,
// may have counted its calls as made before Redis ran them (SortedSet's
// members scored with when it was expected to run, Windows' weight in the
// interval of its stamp). early returns the transaction that counts them
// when they were made, or nil if none is needed, from the transaction's
// replies; inTime reports whether
// it ran, at Redis time ran, before any other decision could have left
// them out of a window by their early count; landed is told that it ran.
// See settleEarly.
type earlyWriter interface {
	round
	early(replies []any, now int64) *txn.Txn
	inTime(ran int64) bool
	landed()
}

var (
	_ earlyWriter = (*zBatch)(nil)
	_ earlyWriter = (*hBatch)(nil)
)

// errRedo: the decision must be made again, its writes having been taken
// back or gone to keys nothing reads.
var errRedo = errors.New("leakybucket: decision to be made again")

// redoAttempts is the attempt from which a batch decided again waits
// first: the second and third attempts follow at once, the third redo
// and every later one wait, from redoFirstPause up to redoMaxPause, so
// that a process that keeps stalling, or a server clock that keeps
// jumping, does not spin.
const (
	redoAttempts   = 3
	redoFirstPause = time.Millisecond
	redoMaxPause   = 50 * time.Millisecond
)

// decideRound decides the calls with rounds made by newRound for the
// estimated Redis time, again if one says so (errRedo), until one does
// not or ctx ends: a round made again is no answer for a caller, who
// gets a Result or an error that says what happened (ctx's, once it
// ends: package batch). A round is made again when a FlushAll made it
// stale, so that only a storm of them, racing one decision, makes it
// wait, for as long as the storm lasts, and never fails its callers (a
// bound of 3 stale rounds, then 15, failed calls during a loop of
// FlushAll calls); or when Redis ran it too far from its stamp (this
// process stalled, or the server's clock jumped: the next round is
// stamped anew), or in a later fixed window, or an epoch it did not read.
func decideRound(ctx context.Context, where Site, newRound func(now int64) round, evaluate Evaluate) error {
	again := newRedoPace()
	for {
		err := decideOnce(ctx, where, newRound, evaluate)
		if !errors.Is(err, errRedo) {
			return err
		}
		if err := again.wait(ctx, err); err != nil {
			return err
		}
	}
}

// A redoPace paces what is made again (errRedo): a decision, or a Windows
// read or Flush that met a FlushAll or read the wrong epoch.
type redoPace struct {
	attempts int
	pause    *backoff.Backoff
}

func newRedoPace() *redoPace { return &redoPace{pause: backoff.New(redoFirstPause, redoMaxPause)} }

// wait is called before what err says to make again is made again. From
// its redoAttempts-th call on it pauses first, but for a round a FlushAll
// made stale:
// only a storm of them makes one wait, for as long as it lasts. Once ctx
// has ended it returns ctx's error, with err: a caller is never told
// only that something was to be made again.
func (r *redoPace) wait(ctx context.Context, err error) error {
	if r.attempts++; r.attempts >= redoAttempts && !errors.Is(err, errStaleGeneration) {
		_ = backoff.Sleep(ctx, r.pause.NextBackoff())
	}
	if ctx.Err() != nil {
		return fmt.Errorf("leakybucket: %w while it was made again: %w", context.Cause(ctx), err)
	}
	return nil
}

// decideOnce runs one round. When the transaction's reply is lost, it
// returns the error at once and, in the background, takes the calls back
// if the transaction ran. When it ran but too few replicas acknowledged
// its writes (WithReplicas), no call is evaluated: each is taken back, and
// the error returned. When the transaction ran at a Redis time far
// from the calls' stamp (Redis's clock jumped, or this process stalled
// between stamping and sending), it takes the calls back and says redo:
// a stamp too early would let the calls leave their windows early.
func decideOnce(ctx context.Context, where Site, newRound func(now int64) round, evaluate Evaluate) error {
	now, err := where.Clock.Estimate(ctx, where.Node)
	if err != nil {
		return err
	}
	r := newRound(now)
	t := txn.New(where.Keys, !r.idempotent())
	where.Markers.Mark(t, where.Keys)
	t.Acks = where.Acks
	carried, keep := where.Carry.take()
	ahead, aheadKeep := where.Ahead.take()
	carried = append(carried, ahead...)
	t.Keep(max(keep, aheadKeep))
	for _, cmd := range carried {
		t.Add(cmd...)
	}
	clock := t.Add("time")
	r.queue(t)
	sent := time.Now()
	switch o, err := t.Exec(ctx, where.Node); o {
	case txn.NotRun:
		where.Markers.Free(t)
		handOn(where, &txn.Txn{Cmds: txn.Resent(carried)}, r.idempotent())
		return err
	case txn.Unknown:
		where.Clock.Reset()
		go recoverLost(where, r, t, carried)
		return err
	case txn.Unreplicated:
		forsake(where, r, t)
		return err
	}
	where.Markers.Free(t)
	back := txn.New(where.Keys, !r.idempotent())
	server, ok := txn.ReplyTime(t.Replies[clock])
	if !ok || stampOff(server, now, time.Since(sent), where.Clock.Pace()) {
		where.Clock.Reset()
		r.takeAll(t, back)
		takeBack(where, back, r.idempotent())
		return fmt.Errorf("%w: Redis ran it %d ms after its stamp", errRedo, server.UnixMilli()-now)
	}
	where.Clock.Sample(server, sent)
	if err := settleEarly(ctx, where, r, t, server.UnixMilli()); err != nil {
		return err
	}
	if err := r.conclude(t, evaluate, back, server.UnixMilli()); err != nil {
		takeBack(where, back, r.idempotent()) // what a decision made again took back, if anything
		return err
	}
	handOn(where, back, r.idempotent())
	return nil
}

// errEarly: a transaction counted its calls as made before Redis ran
// them, and what counts them when they were made ran too late to be sure
// that no other decision left them out of a window meanwhile: its calls
// are taken back and decided again.
var errEarly = fmt.Errorf("%w: its calls were counted early for too long", errRedo)

// settleEarly makes r's calls, which transaction t may have counted as
// made before Redis ran it at now, count from when they were made, before
// any of them is evaluated: so before its callers are answered, and
// never on a later transaction, which may run after them (a process
// killed in between would leave the calls early for good, and a window
// admitting past its limit as they leave it early). Until it runs, others
// count the calls by their early count, which is right as long as no
// window has let them go by it: if one may have, when it ran (inTime),
// or if it did not run, no call of t is admitted, and t's calls are taken
// back, as those of a caller gone (see unsettle), and decided again; or,
// if the settling failed with its context, that error is the callers'. A
// settling that never ran because the hash it guards kept changing
// (settle) is one that did not run: Redis answered, nothing was lost, so
// its calls are decided again, not failed. It asks its replicas as t did:
// a failover that lost it would leave the calls early.
func settleEarly(ctx context.Context, where Site, r round, t *txn.Txn, now int64) error {
	w, ok := r.(earlyWriter)
	if !ok {
		return nil
	}
	fix := w.early(t.Replies, now)
	if fix == nil {
		return nil
	}
	clock := fix.Add("time")
	fix.Acks = where.Acks
	where.Markers.Mark(fix, where.Keys)
	o, err := settle(ctx, where, fix)
	if o == txn.Ran {
		where.Markers.Free(fix)
		w.landed()
		if ran, ok := txn.ReplyTime(fix.Replies[clock]); ok && w.inTime(ran.UnixMilli()) {
			return nil
		}
	}
	if err == nil || errors.Is(err, redis.TxFailedErr) {
		err = errEarly
	}
	unsettle(where, w, t, fix, o)
	return err
}

// settleAttempts bounds how often settle sends a settling transaction
// whose guarded hash changed between its WATCH and its EXEC.
const settleAttempts = 5

// settle runs fix, which settles a round's calls: again, at once, while a
// hash that guards some of its commands (a client's, see txn.Guard)
// changed between its WATCH and its EXEC, up to settleAttempts times. Such
// a fix did not run, and the next attempt reads the guards anew: a
// decision of the same client wrote to its hash meanwhile, which leaves
// the guard holding, or a Flush took the hash, which leaves the commands
// it guards out.
func settle(ctx context.Context, where Site, fix *txn.Txn) (txn.Outcome, error) {
	for attempt := 1; ; attempt++ {
		o, err := fix.Exec(ctx, where.Node)
		if o != txn.NotRun || !errors.Is(err, redis.TxFailedErr) || attempt == settleAttempts || ctx.Err() != nil {
			return o, err
		}
	}
}

// unsettle takes back the calls of w, whose transaction t ran, and whose
// settling fix ran too late, or did not run (o): from where fix put them,
// if it ran; if too few replicas acknowledged it, only where its marker
// is (see forsake). When fix's reply was lost, a take-back that must run
// once waits, in the background, for Resolve to tell where the calls
// are; if it cannot, they stay counted, admitted for no one: their
// leaving early admits nothing past a limit. So does a take-back that
// cannot be made.
func unsettle(where Site, w earlyWriter, t, fix *txn.Txn, o txn.Outcome) {
	switch o {
	case txn.NotRun:
		where.Markers.Free(fix)
	case txn.Unreplicated:
		w.landed()
		takeAllBack(where, w, t, fix)
		return
	case txn.Unknown:
		if !w.idempotent() {
			go func() {
				switch fix.Resolve(where.Node, true) {
				case txn.Ran:
					where.Markers.Free(fix)
					w.landed()
				case txn.Unknown:
					return
				}
				takeAllBack(where, w, t, nil)
			}()
			return
		}
	}
	takeAllBack(where, w, t, nil)
}

// forsake takes back every call of r, whose transaction t ran but whose
// writes too few replicas acknowledged: a failover may lose them, so none
// of its callers is admitted. The take-back runs only where t's marker is
// (txn.Txn.Undoes), for a take-back that must run once: t's writes may be
// on the primary, on a replica, or, after a failover that lost them, on
// neither. The take-backs t carried ran with it, as they would have
// anyway.
func forsake(where Site, r round, t *txn.Txn) { takeAllBack(where, r, t, t) }

// takeAllBack takes back every call of r, whose transaction t ran: only
// where the marker of undo is, if undo is not nil (txn.Txn.Undo).
func takeAllBack(where Site, r round, t, undo *txn.Txn) {
	back := txn.New(where.Keys, !r.idempotent())
	if undo != nil {
		back.Undo(undo)
	}
	r.takeAll(t, back)
	takeBack(where, back, r.idempotent())
}

// handOn hands take-backs to the next batch of the line, which carries
// them at no round trip of their own, when calls wait for it; else, or if
// some are guarded (which a decision cannot carry), it sends them now,
// before the callers are answered, so that their next call counts without
// them. Urgent ones go ahead of the batch's next decision, which decides
// their calls again right after.
func handOn(where Site, back *txn.Txn, idempotent bool) {
	if back.Urgent && where.Ahead != nil && len(back.Guards) == 0 {
		where.Ahead.hand(where, back, idempotent)
		return
	}
	if where.Busy != nil && where.Busy() && len(back.Guards) == 0 && !back.Urgent {
		where.Carry.hand(where, back, idempotent)
		return
	}
	send := txn.New(where.Keys, !idempotent)
	send.Cmds, send.Guards = back.Cmds, back.Guards
	send.Keep(back.Kept())
	takeBack(where, send, idempotent)
}

// stampOff reports whether a transaction stamped now ran too far from
// it, by Redis's clock: more than clock.LagLimit; more than clock.Jump beyond its
// round trip; at all
// on a clock that stands still (a test's, which moves by jumps); and,
// until the clock was seen moving, before its stamp (a running clock
// cannot).
func stampOff(server time.Time, now int64, rtt time.Duration, p clock.Pace) bool {
	off := time.Duration(server.UnixMilli()-now) * time.Millisecond
	if off > clock.LagLimit {
		return true
	}
	switch p {
	case clock.PaceStopped:
		return off != 0
	case clock.PaceUnknown:
		return off < 0 || off > clock.Jump+rtt
	}
	return off > clock.Jump+rtt || off < -clock.Jump
}

// recoverLost settles a round whose transaction t lost its reply: once
// resolve says whether it ran, it takes back every call of r if it did
// (none of their callers was answered), or sends alone the take-backs t
// carried if it did not: as they were when they may run twice (t may
// still run late), else as a resend of them (txn.Txn.Resend), which
// changes a count once whatever t does. A resend sets a marker, which a
// SortedSet user may not (it has no SET). A take-back that must not run
// twice is lost when resolve cannot tell: the calls stay counted, which
// is safe.
func recoverLost(where Site, r round, t *txn.Txn, carried [][]any) {
	o := t.Resolve(where.Node, true)
	if o == txn.Ran {
		// Only then is t's marker key free for another: a transaction
		// found not to have run, or not found, may still run late, and set
		// it over the marker of the one that took it.
		where.Markers.Free(t)
	}
	back := txn.New(where.Keys, !r.idempotent())
	if o == txn.Ran || o == txn.Unknown && r.idempotent() {
		r.takeAll(t, back)
	}
	switch {
	case o == txn.Ran:
	case r.idempotent():
		back.Cmds = append(back.Cmds, txn.Resent(carried)...)
	case o == txn.NotRun:
		back = t.Resend(where.Keys, carried)
	}
	takeBack(where, back, r.idempotent())
}

// Carried is what a line's decisions hand on to the next ones: the
// take-backs that the next carries.
type Carried struct {
	mu         sync.Mutex
	cmds       [][]any
	where      Site  // where to send them alone
	idempotent bool  // as the round's take-backs (round.idempotent)
	keep       int64 // the latest deadline of the hashes cmds change (txn.Txn.Keep)
}

// hand adds back's commands, the take-backs of a batch at where, for the
// next one.
func (c *Carried) hand(where Site, back *txn.Txn, idempotent bool) {
	if c == nil || len(back.Cmds) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds, c.where, c.idempotent = append(c.cmds, back.Cmds...), where, idempotent
	c.keep = max(c.keep, back.Kept())
}

// take returns the commands to carry and the latest deadline of the
// hashes they change, and forgets them.
func (c *Carried) take() ([][]any, int64) {
	if c == nil {
		return nil, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	cmds, keep := c.cmds, c.keep
	c.cmds, c.keep = nil, 0
	return cmds, keep
}

// Flush sends what is left to carry alone: the line has no batch left.
func (c *Carried) Flush() {
	c.mu.Lock()
	where, idempotent := c.where, c.idempotent
	c.mu.Unlock()
	if cmds, keep := c.take(); len(cmds) > 0 {
		back := txn.New(where.Keys, !idempotent)
		back.Cmds = cmds
		back.Keep(keep)
		takeBack(where, back, idempotent)
	}
}

// takeBackFor bounds how long a take-back is tried: the slot of the
// resource may be moving to another node meanwhile.
const takeBackFor = 5 * time.Second

// takeBack runs back, if it holds anything: an idempotent one until it
// ran, another exactly once if it can (one that did not run is sent again;
// one whose reply was lost is resolved, never sent twice), to the slot's
// new owner if it was redirected. A take-back that cannot be made leaves
// the calls counted: others are denied sooner, never admitted past a
// limit. It runs detached from the callers' contexts, which may have
// ended: a caller that gave up must not stay counted.
func takeBack(where Site, back *txn.Txn, idempotent bool) {
	if len(back.Cmds) == 0 && len(back.Guards) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), takeBackFor)
	defer cancel()
	node := where.Node
	backoff.New(txn.ResolveFirstBackoff, txn.ResolveMaxBackoff).Retry(ctx, func() bool {
		where.Markers.Mark(back, where.Keys)
		over, ran, err := tryTakeBack(ctx, node, back, idempotent)
		if ran {
			where.Markers.Free(back) // no resend of a take-back that ran looks for its marker
		}
		if over {
			return true
		}
		if where.Route.Redirected(err) != nil && where.Refind != nil {
			if moved, err := where.Refind(ctx); err == nil {
				node = moved
			}
		}
		back = back.Again(where.Keys)
		return false
	})
}

// tryTakeBack makes one attempt of takeBack, and reports whether it is
// over (it ran, it may have run and must not run twice, or the client was
// closed) and whether it is known to have run.
func tryTakeBack(ctx context.Context, node *redis.Client, back *txn.Txn, idempotent bool) (over, ran bool, err error) {
	o, err := back.Exec(ctx, node)
	if o == txn.Unknown && !idempotent {
		o = back.Resolve(node, false)
	}
	over = o == txn.Ran || o == txn.Unknown && !idempotent || errors.Is(err, redis.ErrClosed)
	return over, o == txn.Ran, err
}
