// Package txn is one MULTI/EXEC sent in one round trip, never twice: the
// transactions of SortedSet and Windows, how to learn whether one ran
// after its reply was lost, guarded take-backs, and how to read EXEC's
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
// fenceDoneGrace, lets resolve learn after a lost reply whether it ran.
// Either way, once Redis answers again it has run whatever it had read
// (a paused server runs the buffered transaction as it resumes), so
// resolve waits until Redis has answered for resolveSettle.
type Txn struct {
	Marker  string // "" if not marked
	Cmds    [][]any
	Guards  []Guard // commands that apply only while a hash is what it was
	Replies []any   // after the EXEC, by command
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
// twice. Every client's hash carries a random incarnation (field
// IncarnationField, set by the decision that makes it); Exec WATCHes the
// guarded hashes, reads their incarnations, and sends the commands of the
// guards whose hash is still one of Want.
type Guard struct {
	Key  string
	Want []string
	Cmds [][]any
}

// IncarnationField is the field of a Windows client's hash that names the
// hash's incarnation: see Guard.
const IncarnationField = "i"

// fenceDoneGrace is how long a marker lives after its transaction ran, for
// resolve to see. resolve polls for at most resolveFor, and decides once
// Redis has answered for resolveSettle: long enough for the server to
// run what it had buffered while it was paused or cut off.
const (
	fenceDoneGrace = 500 * time.Millisecond
	resolveFor     = 10 * time.Second
	resolveSettle  = 20 * time.Millisecond
)

// New returns an empty transaction, marked in keys' slot if marked.
func New(ks keys.Space, marked bool) *Txn {
	t := &Txn{}
	if marked {
		t.Marker = ks.Fence(strconv.FormatUint(rand.Uint64(), 36))
	}
	return t
}

// Again returns t's commands as a new transaction, with a new marker, to
// send after t did not run.
func (t *Txn) Again(ks keys.Space) *Txn {
	fresh := New(ks, t.Marker != "")
	fresh.Cmds, fresh.Guards = t.Cmds, t.Guards
	return fresh
}

// Add queues a command and returns its index among the replies.
func (t *Txn) Add(args ...any) int {
	t.Cmds = append(t.Cmds, args)
	return len(t.Cmds) - 1
}

type Outcome uint8

const (
	Unknown Outcome = iota // the reply was lost: see Resolve
	Ran
	NotRun
)

// Exec sends t on node and reports whether it ran. With NotRun the error
// says why (a command's own error, such as MOVED, or redis.TxFailedErr
// when a guarded hash changed meanwhile); with Unknown, why the reply was
// lost.
func (t *Txn) Exec(ctx context.Context, node *redis.Client) (Outcome, error) {
	if len(t.Guards) == 0 {
		return t.execOn(ctx, node, t.Cmds)
	}
	// One connection, WATCH and the reads in one round trip, MULTI/EXEC
	// in a second; EXEC ends the WATCH whatever it does.
	conn := node.Conn()
	defer conn.Close()
	cmds, err := t.unguarded(ctx, conn)
	if err != nil {
		_ = conn.Do(ctx, "unwatch").Err() // else the pooled connection would abort a later EXEC
		return NotRun, err
	}
	return t.execOn(ctx, conn, cmds)
}

func anys(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// guardKeys returns the keys of t's guards.
func (t *Txn) guardKeys() []string {
	ks := make([]string, len(t.Guards))
	for i, g := range t.Guards {
		ks[i] = g.Key
	}
	return ks
}

// unguarded WATCHes the guarded hashes on conn and reads their
// incarnations, and returns t's commands with those of the guards that
// still hold.
func (t *Txn) unguarded(ctx context.Context, conn *redis.Conn) ([][]any, error) {
	reads := make([]*redis.StringCmd, len(t.Guards))
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Do(ctx, append([]any{"watch"}, anys(t.guardKeys())...)...)
		for i, g := range t.Guards {
			reads[i] = pipe.HGet(ctx, g.Key, IncarnationField)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	cmds := slices.Clip(t.Cmds)
	for i, g := range t.Guards {
		if have, err := reads[i].Result(); err == nil && slices.Contains(g.Want, have) {
			cmds = append(cmds, g.Cmds...)
		}
	}
	return cmds, nil
}

// execOn sends cmds as t on conn (under WATCH if conn is a *redis.Tx).
func (t *Txn) execOn(ctx context.Context, conn Pipeliner, cmds [][]any) (Outcome, error) {
	var exec *redis.Cmd
	// A queued command's own reply is QUEUED, or its error: read as a
	// status, it is not boxed as a generic reply would be.
	queued := make([]*redis.StatusCmd, len(cmds))
	_, err := conn.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		_ = pipe.Process(ctx, noRetry{redis.NewCmd(ctx, "multi")})
		for i, args := range cmds {
			queued[i] = redis.NewStatusCmd(ctx, args...)
			_ = pipe.Process(ctx, queued[i])
		}
		if t.Marker != "" {
			pipe.Do(ctx, "set", t.Marker, "done", "px", fenceDoneGrace.Milliseconds())
		}
		exec = pipe.Do(ctx, "exec")
		return nil
	})
	execErr := exec.Err()
	switch {
	case execErr == nil:
		replies, ok := exec.Val().([]any)
		if !ok || len(replies) < len(cmds) {
			return Unknown, fmt.Errorf("leakybucket: EXEC replied %T with %d replies", exec.Val(), len(replies))
		}
		t.Replies = replies[:len(cmds)]
		return Ran, nil
	case errors.Is(execErr, redis.Nil):
		return NotRun, redis.TxFailedErr // a WATCHed key changed
	case isRedisError(execErr):
		return NotRun, queuedError(queued, execErr) // EXECABORT
	}
	return Unknown, err
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

func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// queuedError is the error of the first command Redis refused to queue
// (MOVED, ASK, NOPERM...), or else err.
func queuedError(queued []*redis.StatusCmd, err error) error {
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
// resolveSettle, t has run if it ever will, and a marked t shows it.
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
	case time.Since(r.answered) >= resolveSettle && r.marked:
		return NotRun, true
	case time.Since(r.answered) >= resolveSettle:
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
	return done == "done", err
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
