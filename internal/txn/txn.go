// Package txn is one MULTI/EXEC sent in one round trip, never twice: the
// transactions of SortedSet and Windows and the lock's release, how to
// learn whether one ran after its reply was lost, guarded take-backs, the
// replicas' acknowledgement of its writes (WAIT), and how to read EXEC's
// replies (RESP2 or RESP3).
package txn

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
	"github.com/leakybucket/leakybucket/internal/keys"
)

// A Txn is one MULTI/EXEC, sent in one round trip, that go-redis never
// sends twice: its retries would run it again after a reply that was lost
// although the transaction ran. Its commands are sent with Do, and their
// replies read by hand from the EXEC's.
//
// A txn whose effect cannot be undone by repeating an undo (Windows'
// HINCRBY) is marked: its last command, SET marker done PX
// fenceDoneGrace (or until Keep if it takes intervals down), lets resolve
// learn after a lost reply whether it ran, and a resend whether to apply.
// Either way, once Redis answers again it has run whatever it had read
// (a paused server runs the buffered transaction as it resumes), so
// resolve waits until Redis has answered for resolveQuiet.
type Txn struct {
	Marker string // the marker's key, "" if not marked
	mark   string // what the marker is set to: this transaction's own
	named  int    // 1 + the name of Marker among a Markers', 0 if none
	Cmds   [][]any
	args   []any   // the arguments of the commands Add queued, in one array
	Guards []Guard // commands that apply only while a hash is what it was
	// Undoes, if not "", is the marker key of the transaction that t
	// takes back (see Undo): t applies only on a server where that key
	// holds that transaction's own value, undoMark (see Exec).
	Undoes   string
	undoMark string
	// resends, if not "", is the marker key of the transaction u whose
	// take-backs t sends again (see Again): t applies only where that key
	// does not hold u's own value, resendMark.
	resends, resendMark string
	foundNotRun         bool // by Resolve, which can be wrong: see Again
	// keep is the latest deadline (absolute Redis ms) of the hashes whose
	// intervals t's commands change: a marker of t's lives until then, for
	// t's resends to find (see Keep).
	keep    int64
	Acks    Acks  // the replicas that must acknowledge t's writes: none if zero
	Replies []any // after the EXEC, by command
	// Urgent: a take-back that must run before the calls it takes back
	// are decided again, right after: sent ahead of that decision, never
	// carried by a later batch.
	Urgent bool
}

// A Guard holds take-backs of weight written to a Windows client's hash:
// they apply only while that hash is still the one the weight was written
// to. Flush deletes a client's hash, taking its whole share out of the
// resource's with it, the weight to be taken back included; a take-back
// that came after must then do nothing, or that weight would be taken out
// twice. Every client's hash carries a random incarnation (in its field
// Field, set by the decision that makes it); Exec WATCHes the guarded
// hashes, reads their incarnations, and sends the commands of the guards
// whose hash is still one of Want.
type Guard struct {
	Key   string
	Field string // the field of Key that holds its incarnation
	Want  []string
	Cmds  [][]any
}

// fenceDoneGrace is how long a marker lives after its transaction ran (and
// after the wait for its replicas, see Acks), for Resolve to see. Resolve
// polls for at most resolveFor, and decides once Redis has answered for
// resolveQuiet: long enough for the server to run what it had buffered
// while it was paused or cut off, and for bytes of the transaction held
// up on their way to arrive: longer than TCP's shortest retransmission
// timeout (200 ms on Linux), and than the lag of a proxy on a starved
// host (seen up to 150 ms). A verdict that it did not run is still wrong
// if they arrive later (see Again and Resend).
const (
	fenceDoneGrace = 500 * time.Millisecond
	resolveFor     = 10 * time.Second
	resolveQuiet   = 250 * time.Millisecond
)

// New returns an empty transaction, marked in keys' slot if marked.
func New(ks keys.Space, marked bool) *Txn {
	t := &Txn{}
	if marked {
		t.Marker, t.mark = ks.Fence(strconv.FormatUint(rand.Uint64(), 36)), strconv.FormatUint(rand.Uint64(), 36)
	}
	return t
}

// Keep says that t's commands change intervals of a hash whose deadline
// is at (absolute Redis ms). A marked t that takes intervals down keeps
// its marker until the latest such deadline (PEXPIREAT GT, after the SET
// of fenceDoneGrace), on the clock that expires the hashes: its resends
// (see Resend) find the marker as long as a hash it changed is there; after
// that, a resend, or t running late, changes a hash that is gone, and
// makes none (txn.DropIfMade).
func (t *Txn) Keep(at int64) { t.keep = max(t.keep, at) }

// Kept is the latest deadline Keep was told of, 0 if none.
func (t *Txn) Kept() int64 { return t.keep }

// Undo makes t take back what u wrote: t applies only on a server that
// holds u's marker, set to u's own value, for u's writes may be on the
// primary that ran it, on a replica it reached, on both, or on neither
// (see Exec). A marker key that another transaction set since holds
// another value: then t does nothing, and u's writes stay counted until
// they expire, which errs on the side of denying.
func (t *Txn) Undo(u *Txn) { t.Undoes, t.undoMark = u.Marker, u.mark }

// Again returns t's commands as a new transaction, with a new marker, to
// send after t did not run, or was found not to have run: but its
// shrinks of a total (see Resent). If Resolve found that t did not run,
// the verdict can be wrong (t's bytes, held up on their way, reach Redis
// after it, and t runs late), so t's changes of intervals are sent
// again as a resend of them (see Resend). A resend sent again is the same
// resend.
func (t *Txn) Again(ks keys.Space) *Txn {
	if t.foundNotRun && t.Marker != "" && t.resends == "" {
		return t.resend(ks, t.Cmds, t.Guards)
	}
	fresh := New(ks, t.Marker != "")
	fresh.Cmds, fresh.Guards = Resent(t.Cmds), make([]Guard, len(t.Guards))
	for i, g := range t.Guards {
		fresh.Guards[i] = Guard{Key: g.Key, Field: g.Field, Want: g.Want, Cmds: Resent(g.Cmds)}
	}
	fresh.Undoes, fresh.undoMark, fresh.keep = t.Undoes, t.undoMark, t.keep
	fresh.resends, fresh.resendMark = t.resends, t.resendMark
	return fresh
}

// Add queues a command and returns its index among the replies. It copies
// args into one array that holds the arguments of every command it queued,
// so that a command costs no allocation of its own (a batch queues a few
// per call), and a caller may reuse args.
func (t *Txn) Add(args ...any) int {
	first := len(t.args)
	t.args = append(t.args, args...)
	t.Cmds = append(t.Cmds, t.args[first:len(t.args):len(t.args)])
	return len(t.Cmds) - 1
}

// Grow makes room for cmds more commands of args arguments in all, as
// slices.Grow does: a batch that knows how many it queues allocates once.
func (t *Txn) Grow(cmds, args int) {
	t.Cmds, t.args = slices.Grow(t.Cmds, cmds), slices.Grow(t.args, args)
}

type Outcome uint8

const (
	Unknown Outcome = iota // the reply was lost: see Resolve
	Ran
	NotRun
	// Unreplicated: it ran, and its replies were read, but fewer replicas
	// than Acks asks are known to have acknowledged its writes: a failover
	// may lose them. Its error matches ErrNotReplicated.
	Unreplicated
)

// Exec sends t on node and reports whether it ran. With NotRun the error
// says why (a command's own error, such as MOVED, or redis.TxFailedErr
// when a guarded hash changed meanwhile); with Unknown, why the reply was
// lost; with Unreplicated, why its writes are not known to be on enough
// replicas.
//
// A t that undoes another transaction (Undoes) runs only where that
// transaction's marker is: its writes may be on the primary that ran it,
// on a replica it reached, on both, or, after a failover that lost them,
// on neither, and an undo that is not idempotent (HINCRBY of minus a
// weight) must never take from a server what was never written there.
// The marker is written in the same MULTI/EXEC as the writes, so a server
// holds both or neither (until the marker expires: then t does nothing,
// and the writes stay counted, which errs on the side of denying).
//
// A resend (see Resend) runs only where the marker of the transaction it
// stands for does not say that one ran, and only while that marker would
// still be there: else it does nothing, and says it ran (nothing is left
// to send).
func (t *Txn) Exec(ctx context.Context, node *redis.Client) (Outcome, error) {
	if len(t.Guards) == 0 && t.Undoes == "" && t.resends == "" {
		return t.execOn(ctx, node, t.Cmds, t.cancels(0, t.Cmds), node.Options().ReadTimeout)
	}
	// One connection, WATCH and the reads in one round trip, MULTI/EXEC
	// in a second; EXEC ends the WATCH whatever it does.
	conn := node.Conn()
	defer conn.Close()
	cmds, cancels, err := t.unguarded(ctx, conn)
	if err != nil || cmds == nil {
		_ = conn.Do(ctx, "unwatch").Err() // else the pooled connection would abort a later EXEC
		if err != nil {
			return NotRun, err
		}
		return Ran, nil // nothing of what it undoes is on this server, or nothing to resend
	}
	return t.execOn(ctx, conn, cmds, cancels, node.Options().ReadTimeout)
}

// ExecOn sends t, which has no guards, on conn, a connection the caller
// holds (the *redis.Tx of a lock, under its WATCH), whose client's reads
// time out after readTimeout (none if not positive: see Acks); it reports
// as Exec does.
func (t *Txn) ExecOn(ctx context.Context, conn Pipeliner, readTimeout time.Duration) (Outcome, error) {
	return t.execOn(ctx, conn, t.Cmds, t.cancels(0, t.Cmds), readTimeout)
}

func anys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// watched returns the keys t WATCHes: its guards', the marker of what it
// undoes, and the marker of the transaction it resends.
func (t *Txn) watched() []string {
	ks := make([]string, len(t.Guards), len(t.Guards)+2)
	for i, g := range t.Guards {
		ks[i] = g.Key
	}
	for _, marker := range []string{t.Undoes, t.resends} {
		if marker != "" {
			ks = append(ks, marker)
		}
	}
	return ks
}

// unguarded WATCHes the guarded hashes, the marker of what t undoes and
// the one of what it resends, on conn, and reads the hashes'
// incarnations and the markers; it returns t's commands with those of the
// guards that still hold, and the cancels of those commands, or nil if
// the markers say that t has nothing to do on this server (see skips).
func (t *Txn) unguarded(ctx context.Context, conn *redis.Conn) (cmds, cancels [][]any, err error) {
	reads := make([]*redis.StringCmd, len(t.Guards))
	var undone, resent *redis.StringCmd
	_, err = conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, append([]any{"watch"}, anys(t.watched())...)...)
		for i, g := range t.Guards {
			reads[i] = pipe.HGet(ctx, g.Key, g.Field)
		}
		undone, resent = t.getMarker(ctx, pipe, t.Undoes), t.getMarker(ctx, pipe, t.resends)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, err
	}
	if t.skips(undone, resent) {
		return nil, nil, nil
	}
	cmds, cancels = slices.Clip(t.Cmds), t.cancels(0, t.Cmds)
	for i, g := range t.Guards {
		if have, err := reads[i].Result(); err == nil && slices.Contains(g.Want, have) {
			cmds = append(cmds, g.Cmds...)
			cancels = append(cancels, t.cancels(i+1, g.Cmds)...)
		}
	}
	return cmds, cancels, nil
}

// getMarker queues the read of the marker key, if there is one.
func (t *Txn) getMarker(ctx context.Context, pipe redis.Pipeliner, key string) *redis.StringCmd {
	if key == "" {
		return nil
	}
	return pipe.Get(ctx, key)
}

// skips reports whether t has nothing to do, by the markers read (nil if
// not read): what it undoes is not on this server, or what it resends ran
// (its marker holds its value).
func (t *Txn) skips(undone, resent *redis.StringCmd) bool {
	if undone != nil && undone.Val() != t.undoMark {
		return true
	}
	return resent != nil && resent.Val() == t.resendMark
}

// execOn sends cmds as t on conn (under WATCH if conn is a *redis.Tx),
// then cancels (see cancels), whose replies are not read, and WAIT after
// the EXEC if t asks for acknowledgements (see Acks).
func (t *Txn) execOn(ctx context.Context, conn Pipeliner, cmds, cancels [][]any, readTimeout time.Duration) (Outcome, error) {
	var waitMs int64
	if t.Acks.Replicas > 0 {
		waitMs = t.Acks.wait(time.Now(), readTimeout)
	}
	all := cmds
	if len(cancels) > 0 {
		all = slices.Concat(cmds, cancels)
	}
	// The whole transaction is made here and handed to the pipeline at
	// once (BatchProcess), so that its array of commands is made once, not
	// grown as each is queued: a batch queues a few commands per call. A
	// queued command's own reply is QUEUED, or its error: read as a
	// status, it is not boxed as a generic reply would be.
	batch := make([]redis.Cmder, 0, len(all)+5)
	batch = append(batch, noRetry{redis.NewCmd(ctx, "multi")})
	for _, args := range all {
		batch = append(batch, redis.NewStatusCmd(ctx, args...))
	}
	queued := batch[1:]
	batch = t.appendMarker(ctx, batch, len(cancels) > 0, waitMs)
	exec := redis.NewCmd(ctx, "exec")
	batch = append(batch, exec)
	var wait *redis.Cmd
	if t.Acks.Replicas > 0 {
		wait = redis.NewCmd(ctx, "wait", t.Acks.Replicas, waitMs)
		batch = append(batch, wait)
	}
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		return pipe.BatchProcess(ctx, batch...)
	})
	execErr := exec.Err()
	switch {
	case execErr == nil:
		replies, ok := exec.Val().([]any)
		if !ok || len(replies) < len(cmds) {
			return Unknown, fmt.Errorf("leakybucket: EXEC replied %T with %d replies", exec.Val(), len(replies))
		}
		t.Replies = replies[:len(cmds)]
		return t.acknowledged(wait, waitMs)
	case errors.Is(execErr, redis.Nil):
		return NotRun, redis.TxFailedErr // a WATCHed key changed
	case isRedisError(execErr):
		return NotRun, queuedError(queued[:len(all)], execErr) // EXECABORT
	}
	return Unknown, err
}

// appendMarker appends the SET of a marked t's marker, which outlives the
// wait too (a take-back of what too few replicas acknowledged looks for
// it, see Undo), and, if t takes intervals down (shrinks), lives until the
// hashes it changes expire (see Keep).
func (t *Txn) appendMarker(ctx context.Context, batch []redis.Cmder, shrinks bool, waitMs int64) []redis.Cmder {
	if t.Marker == "" {
		return batch
	}
	batch = append(batch, redis.NewCmd(ctx, "set", t.Marker, t.mark, "px", fenceDoneGrace.Milliseconds()+waitMs))
	if shrinks && t.keep > 0 {
		batch = append(batch, redis.NewCmd(ctx, "pexpireat", t.Marker, t.keep, "gt"))
	}
	return batch
}

// Pipeliner is a connection: a *redis.Client, a *redis.Conn, or the
// *redis.Tx that holds a lock.
type Pipeliner interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// noRetry is a command that go-redis never sends again, nor the pipeline
// that holds it.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// ErrNotReplicated: a transaction ran, but fewer replicas than its Acks
// asked are known to have acknowledged its writes when its wait ended. The
// root package re-exports it, with its documentation.
var ErrNotReplicated = errors.New("leakybucket: the replicas did not acknowledge the decision's writes")

// Acks asks that a transaction's writes be acknowledged by Replicas
// replicas before its replies count: Redis's WAIT, pipelined after the
// EXEC, in the same round trip and on the same connection. WAIT counts the
// replicas that acknowledged every write of its connection so far, so the
// earlier writes a pooled connection carried only make it wait for more,
// never count for the transaction's. It waits at most Timeout, and less
// when By, the time its answer is due (the earliest deadline of the calls
// it decides), or the client's read timeout comes first (see wait).
type Acks struct {
	Replicas int
	Timeout  time.Duration
	By       time.Time // zero: no deadline
}

// wait returns WAIT's timeout in ms for a transaction sent at now on a
// client whose reads time out after readTimeout (none if not positive):
// Timeout, or less, so that its answer arrives before By, and before the
// read times out. Redis ends a WAIT that timed out at its next cron tick,
// up to cronLag late on an idle server; and the reply must travel back:
// so the wait leaves cronLag and a fifth of the time left. A call then
// ends within its deadline as not replicated, rather than as timed out,
// when its deadline leaves it more than cronLag. Never 0, which WAIT
// takes as forever.
func (a Acks) wait(now time.Time, readTimeout time.Duration) int64 {
	d := a.Timeout
	if !a.By.IsZero() {
		d = min(d, spare(a.By.Sub(now)))
	}
	if readTimeout > 0 {
		d = min(d, spare(readTimeout))
	}
	return max(d.Milliseconds(), 1)
}

// cronLag is how late Redis may end a WAIT that timed out: it checks the
// timeouts of blocked clients when its event loop wakes, on an idle server
// at its cron, every 1/hz (hz 10 by default). Measured on an idle Redis
// 7.0: WAIT 1 50 answered after 90 ms.
const cronLag = 100 * time.Millisecond

// spare is how long a wait may last when left remains: less a fifth of
// it, and cronLag.
func spare(left time.Duration) time.Duration { return left - left/5 - cronLag }

// acknowledged is the outcome of a transaction that ran, by the reply of
// the WAIT that followed it (nil if it sent none), which waited waitMs.
// A WAIT that failed (refused, such as NOPERM, or its reply lost) leaves
// the writes unacknowledged too: its error is the cause.
func (t *Txn) acknowledged(wait *redis.Cmd, waitMs int64) (Outcome, error) {
	if wait == nil {
		return Ran, nil
	}
	n, err := wait.Int64()
	switch {
	case err != nil:
		return Unreplicated, fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	case n < int64(t.Acks.Replicas):
		return Unreplicated, fmt.Errorf("%w: %d of %d replicas within %d ms", ErrNotReplicated, n, t.Acks.Replicas, waitMs)
	}
	return Ran, nil
}

func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// queuedError is the error of the first command Redis refused to queue
// (MOVED, ASK, NOPERM...), or else err.
func queuedError(queued []redis.Cmder, err error) error {
	for _, c := range queued {
		if c.Err() != nil {
			return c.Err()
		}
	}
	return err
}

// Backoff of resolve's attempts.
const (
	ResolveFirstBackoff = 2 * time.Millisecond
	ResolveMaxBackoff   = 200 * time.Millisecond
)

// Resolve learns whether t ran after its reply was lost, on a connection
// of its own, detached from any caller: once Redis has answered for
// resolveQuiet, t has run if it ever will, and a marked t shows it.
// An unmarked t resolves to unknown then: its undo is to be repeated
// rather than known. resolve returns unknown too if Redis could not be
// asked within resolveFor. With refusedIsGone, a refused connection means
// the server is gone with what it had read (a decision's transaction: if
// a proxy refused while the server ran it, its calls stay counted, which
// is safe); else (a take-back's, which must never run twice) resolve
// keeps asking.
func (t *Txn) Resolve(node *redis.Client, refusedIsGone bool) Outcome {
	ctx, cancel := context.WithTimeout(context.Background(), resolveFor)
	defer cancel()
	r := resolution{marked: t.Marker != "", refusedIsGone: refusedIsGone}
	verdict := Unknown
	backoff.New(ResolveFirstBackoff, ResolveMaxBackoff).Retry(ctx, func() (over bool) {
		done, err := t.look(ctx, node)
		verdict, over = r.next(done, err)
		return over
	})
	t.foundNotRun = verdict == NotRun
	return verdict
}

// resolution is what resolve learned so far.
type resolution struct {
	marked, refusedIsGone bool
	answered              time.Time // since when Redis answers
}

// next takes one look's outcome, and returns the verdict once there is
// one.
func (r *resolution) next(done bool, err error) (Outcome, bool) {
	switch {
	case done:
		return Ran, true
	case errors.Is(err, redis.ErrClosed):
		return Unknown, true // the client was closed: nothing more can be sent
	case r.refusedIsGone && errors.Is(err, syscall.ECONNREFUSED):
		return NotRun, true
	case err != nil:
		// Even a refused connection proves nothing: a proxy may refuse
		// while the server runs what it had read.
		r.answered = time.Time{}
	case r.answered.IsZero():
		r.answered = time.Now()
	case time.Since(r.answered) >= resolveQuiet && r.marked:
		return NotRun, true // which can be wrong: see Again
	case time.Since(r.answered) >= resolveQuiet:
		return Unknown, true
	}
	return Unknown, false
}

// look makes one attempt of resolve: whether the marker says done.
func (t *Txn) look(ctx context.Context, node *redis.Client) (bool, error) {
	if t.Marker == "" {
		return false, node.Ping(ctx).Err()
	}
	done, err := node.Get(ctx, t.Marker).Result()
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return done == t.mark, err
}

// ExtendTo returns the commands that make key expire at at (absolute Redis
// ms) unless it expires later already: PEXPIREAT NX gives a key that the
// transaction made (it has no deadline yet) its first, and PEXPIREAT GT
// only ever moves a deadline later. So a writer whose stamp trails
// another's, or who comes late, never shortens a key's life.
func ExtendTo(key any, at int64) [][]any {
	a := any(at) // boxed once for both
	return [][]any{{"pexpireat", key, a, "nx"}, {"pexpireat", key, a, "gt"}}
}

// DropIfMade returns the command that deletes key at once if the commands
// before it in the transaction made it (it has no deadline yet), and else
// does nothing: a take-back's. The weight a take-back takes out was
// written to a key whose deadline covers every interval any rule may
// count it in; finding the key gone, the take-back would make a key of
// negative counts, which is dropped rather than let live.
func DropIfMade(key string) []any { return []any{"pexpireat", key, 1, "nx"} }

// Replies of EXEC, as go-redis reads them (RESP3 or RESP2).

func ReplyInt(v any) int64 {
	n, _ := v.(int64)
	return n
}

// ReplyScores reads a ZRANGE ... WITHSCORES reply as its scores.
func ReplyScores(v any) []float64 {
	items, _ := v.([]any)
	var out []float64
	for i := 0; i < len(items); i++ {
		switch item := items[i].(type) {
		case []any: // RESP3: [member, score]
			if len(item) == 2 {
				out = append(out, replyFloat(item[1]))
			}
		default: // RESP2: member, score, ...
			if i+1 < len(items) {
				out = append(out, replyFloat(items[i+1]))
				i++
			}
		}
	}
	return out
}

func replyFloat(v any) float64 {
	switch f := v.(type) {
	case float64:
		return f
	case string:
		x, _ := strconv.ParseFloat(f, 64)
		return x
	case int64:
		return float64(f)
	}
	return 0
}

// ReplyFields reads an HGETALL reply as its fields and values.
func ReplyFields(v any) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		switch h := v.(type) {
		case map[any]any: // RESP3
			for k, v := range h {
				if !yield(ReplyString(k), ReplyString(v)) {
					return
				}
			}
		case []any: // RESP2
			for i := 0; i+1 < len(h); i += 2 {
				if !yield(ReplyString(h[i]), ReplyString(h[i+1])) {
					return
				}
			}
		}
	}
}

// ReplyLen is how many fields an HGETALL reply holds.
func ReplyLen(v any) int {
	switch h := v.(type) {
	case map[any]any:
		return len(h)
	case []any:
		return len(h) / 2
	}
	return 0
}

func ReplyString(v any) string {
	switch s := v.(type) {
	case string:
		return s
	case int64:
		return strconv.FormatInt(s, 10)
	}
	return fmt.Sprint(v)
}

// ReplyTime reads a TIME reply.
func ReplyTime(v any) (time.Time, bool) {
	parts, _ := v.([]any)
	if len(parts) != 2 {
		return time.Time{}, false
	}
	sec, err1 := strconv.ParseInt(ReplyString(parts[0]), 10, 64)
	usec, err2 := strconv.ParseInt(ReplyString(parts[1]), 10, 64)
	return time.Unix(sec, usec*1000), err1 == nil && err2 == nil
}
