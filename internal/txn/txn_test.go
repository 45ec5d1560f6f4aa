package txn

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
)

func clientOf(t *testing.T, protocol int) (*miniredis.Miniredis, *redis.Client) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), Protocol: protocol})
	t.Cleanup(func() { rdb.Close() })
	return mr, rdb
}

// A transaction runs once, and its replies read the same in RESP2 and
// RESP3.
func TestExecAndReplies(t *testing.T) {
	for _, protocol := range []int{2, 3} {
		mr, rdb := clientOf(t, protocol)
		mr.SetTime(time.UnixMilli(1_700_000_000_123))
		tx := New(keys.Of("p", "r"), true)
		incr := tx.Add("hincrby", "h", "7", 3)
		read := tx.Add("hgetall", "h")
		zadd := tx.Add("zadd", "z", 5, "a")
		scores := tx.Add("zrange", "z", 0, -1, "withscores")
		now := tx.Add("time")
		o, err := tx.Exec(context.Background(), rdb)
		if o != Ran || err != nil {
			t.Fatalf("RESP%d: Exec = %v, %v", protocol, o, err)
		}
		fields := maps.Collect(ReplyFields(tx.Replies[read]))
		at, ok := ReplyTime(tx.Replies[now])
		switch {
		case ReplyInt(tx.Replies[incr]) != 3 || ReplyInt(tx.Replies[zadd]) != 1:
			t.Errorf("RESP%d: HINCRBY, ZADD replied %v, %v", protocol, tx.Replies[incr], tx.Replies[zadd])
		case len(fields) != 1 || fields["7"] != "3" || ReplyLen(tx.Replies[read]) != 1:
			t.Errorf("RESP%d: HGETALL read %v", protocol, fields)
		case len(ReplyScores(tx.Replies[scores])) != 1 || ReplyScores(tx.Replies[scores])[0] != 5:
			t.Errorf("RESP%d: ZRANGE WITHSCORES read %v", protocol, ReplyScores(tx.Replies[scores]))
		case !ok || at.UnixMilli() != 1_700_000_000_123:
			t.Errorf("RESP%d: TIME read %v, %v", protocol, at, ok)
		}
		// A marked transaction that ran says so, for Resolve.
		if got := tx.Resolve(rdb, false); got != Ran {
			t.Errorf("RESP%d: Resolve of a marked transaction that ran = %v", protocol, got)
		}
	}
}

// A guarded command applies only while its hash is the incarnation it
// wants; the rest of the transaction applies either way.
func TestGuards(t *testing.T) {
	mr, rdb := clientOf(t, 3)
	mr.HSet("h", "i", "a")
	for _, c := range []struct {
		want    string
		applied bool
	}{{"a", true}, {"b", false}} {
		mr.HSet("h", "n", "10")
		mr.Set("other", "0")
		tx := New(keys.Of("p", "r"), false)
		tx.Add("incr", "other")
		tx.Guards = []Guard{{Key: "h", Field: "i", Want: []string{c.want}, Cmds: [][]any{{"hincrby", "h", "n", -4}}}}
		if o, err := tx.Exec(context.Background(), rdb); o != Ran || err != nil {
			t.Fatalf("want %q: Exec = %v, %v", c.want, o, err)
		}
		n := mr.HGet("h", "n")
		if other, _ := mr.Get("other"); other != "1" || (n == "6") != c.applied {
			t.Errorf("want %q: n = %s, other = %s; guarded applied: want %v", c.want, n, other, c.applied)
		}
	}
}

// WAIT's timeout: the Acks' own, or less so that the answer arrives
// before the calls' deadline and the client's read timeout, leaving a
// fifth of the time and Redis's cron lag; never 0 (forever).
func TestAcksWait(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		timeout, by, read time.Duration // by: 0 for no deadline
		want              int64
	}{
		{50 * time.Millisecond, 0, 0, 50},
		{50 * time.Millisecond, time.Second, 5 * time.Second, 50},
		{time.Second, 300 * time.Millisecond, 0, 140},
		{time.Second, 0, time.Second, 700},
		{time.Second, 100 * time.Millisecond, 0, 1},
		{time.Second, -time.Second, 0, 1}, // the deadline passed
	} {
		a := Acks{Replicas: 1, Timeout: c.timeout}
		if c.by != 0 {
			a.By = now.Add(c.by)
		}
		if got := a.wait(now, c.read); got != c.want {
			t.Errorf("Acks{Timeout: %v, By: now+%v}.wait(read timeout %v) = %d ms, want %d", c.timeout, c.by, c.read, got, c.want)
		}
	}
}

// A transaction that asks for acknowledgements sends WAIT after its
// EXEC: it ran either way; with too few replicas (miniredis answers 0) it
// is Unreplicated, with ErrNotReplicated.
func TestAcks(t *testing.T) {
	mr, rdb := clientOf(t, 3)
	tx := New(keys.Of("p", "r"), false)
	tx.Acks = Acks{Replicas: 1, Timeout: 10 * time.Millisecond}
	tx.Add("incr", "n")
	o, err := tx.Exec(context.Background(), rdb)
	if o != Unreplicated || !errors.Is(err, ErrNotReplicated) || len(tx.Replies) != 1 {
		t.Fatalf("Exec = %v, %v, replies %v: want Unreplicated, ErrNotReplicated, the replies read", o, err, tx.Replies)
	}
	if got, _ := mr.Get("n"); got != "1" {
		t.Errorf("n = %q: the transaction did not run", got)
	}
	// A marked one's marker outlives its wait, for its take-back to find.
	marked := New(keys.Of("p", "r"), true)
	marked.Acks = Acks{Replicas: 1, Timeout: 800 * time.Millisecond}
	marked.Add("incr", "n")
	if o, _ := marked.Exec(context.Background(), rdb); o != Unreplicated || mr.TTL(marked.Marker) < fenceDoneGrace+800*time.Millisecond {
		t.Errorf("marked: %v, the marker's TTL %v: want it to outlive the wait by %v", o, mr.TTL(marked.Marker), fenceDoneGrace)
	}
}

// A transaction that undoes another applies only where that one's marker
// is: elsewhere it does nothing, and says it ran (nothing is left to
// undo there).
func TestUndoes(t *testing.T) {
	mr, rdb := clientOf(t, 3)
	ks := keys.Of("p", "r")
	decision := New(ks, true)
	decision.Add("hincrby", "h", "7", 3)
	if o, err := decision.Exec(context.Background(), rdb); o != Ran || err != nil {
		t.Fatalf("decision: %v, %v", o, err)
	}
	undo := func() *Txn {
		back := New(ks, true)
		back.Undo(decision)
		back.Add("hincrby", "h", "7", -3)
		return back
	}
	mr.Del(decision.Marker) // as on a server the decision never reached
	if o, err := undo().Exec(context.Background(), rdb); o != Ran || err != nil || mr.HGet("h", "7") != "3" {
		t.Errorf("without the marker: %v, %v, h[7] = %q: want nothing undone", o, err, mr.HGet("h", "7"))
	}
	mr.Set(decision.Marker, "another's") // a later transaction set the key again
	if o, err := undo().Exec(context.Background(), rdb); o != Ran || err != nil || mr.HGet("h", "7") != "3" {
		t.Errorf("with another's marker: %v, %v, h[7] = %q: want nothing undone", o, err, mr.HGet("h", "7"))
	}
	mr.Set(decision.Marker, decision.mark)
	if o, err := undo().Exec(context.Background(), rdb); o != Ran || err != nil || mr.HGet("h", "7") != "0" {
		t.Errorf("with the marker: %v, %v, h[7] = %q: want it undone", o, err, mr.HGet("h", "7"))
	}
	// The connection went back to the pool without a WATCH: a later EXEC
	// runs.
	later := New(ks, false)
	later.Add("set", "k", "v")
	if o, err := later.Exec(context.Background(), rdb); o != Ran || err != nil {
		t.Errorf("a later transaction: %v, %v", o, err)
	}
}

// A take-back sent again, after Resolve found the transaction u that
// carried it not to have run, takes its intervals down exactly once as a
// read sees them (the field less the pending fields' weights), whatever
// the order in which u (its bytes held up, it runs late) and the resends
// run: in u's own commands and in its guards'.
func TestResendOnce(t *testing.T) {
	ks := keys.Of("p", "r")
	for _, c := range []struct {
		name  string
		order func(t *testing.T, rdb *redis.Client, u, resend *Txn)
	}{
		{"resend alone", func(t *testing.T, rdb *redis.Client, _, r *Txn) { mustRun(t, rdb, r) }},
		{"u late, after the resend", func(t *testing.T, rdb *redis.Client, u, r *Txn) { mustRun(t, rdb, r); mustRun(t, rdb, u) }},
		{"u before the resend", func(t *testing.T, rdb *redis.Client, u, r *Txn) { mustRun(t, rdb, u); mustRun(t, rdb, r) }},
		{"resend, u, resend again", func(t *testing.T, rdb *redis.Client, u, r *Txn) {
			mustRun(t, rdb, r)
			mustRun(t, rdb, u)
			mustRun(t, rdb, r.Again(ks))
		}},
		{"resend twice, then u", func(t *testing.T, rdb *redis.Client, u, r *Txn) {
			mustRun(t, rdb, r)
			mustRun(t, rdb, r.Again(ks))
			mustRun(t, rdb, u)
		}},
		{"u between the resend's WATCH and its EXEC", func(t *testing.T, rdb *redis.Client, u, r *Txn) {
			other := redis.NewClient(rdb.Options())
			defer other.Close()
			rdb.AddHook(runFirst{"multi", func() { mustRun(t, other, u) }, &sync.Once{}})
			if o, err := r.Exec(context.Background(), rdb); o != NotRun || !errors.Is(err, redis.TxFailedErr) {
				t.Fatalf("the raced resend: %v, %v; want NotRun, TxFailedErr", o, err)
			}
			mustRun(t, rdb, r.Again(ks))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mr, rdb := clientOf(t, 3)
			mr.HSet("h", "7", "10")
			mr.HSet("h", TotalField, "10")
			mr.HSet("c", "7", "10")
			mr.HSet("c", "i", "x")
			u := New(ks, true)
			u.Add("hincrby", "h", TotalField, -3)
			u.Add("hincrby", "h", "7", -3)
			u.Add("hincrby", "h", "7", -1) // a move of 1 from 7 to 8
			u.Add("hincrby", "h", "8", 1)
			u.Guards = []Guard{{Key: "c", Field: "i", Want: []string{"x"}, Cmds: [][]any{{"hincrby", "c", "7", -2}, {"hincrby", "h", "7", -2}}}}
			if o := u.Resolve(rdb, false); o != NotRun {
				t.Fatalf("Resolve of a transaction never sent = %v, want NotRun", o)
			}
			c.order(t, rdb, u, u.Again(ks))
			if h, h8, c := readAs(mr, "h", "7"), readAs(mr, "h", "8"), readAs(mr, "c", "7"); h != 4 || h8 != 1 || c != 8 {
				t.Errorf("h[7] reads %d, h[8] %d, c[7] %d: want 4, 1, 8 (10 less 3, 1 and 2, 1 moved, 10 less 2: once)", h, h8, c)
			}
			if total := readAs(mr, "h", TotalField); total < readAs(mr, "h", "7")+readAs(mr, "h", "8") {
				t.Errorf("h's total %d is less than its intervals hold", total)
			}
		})
	}
}

// mustRun runs tx on rdb, and fails t unless it ran.
func mustRun(t *testing.T, rdb *redis.Client, tx *Txn) {
	t.Helper()
	if o, err := tx.Exec(context.Background(), rdb); o != Ran || err != nil {
		t.Fatalf("Exec = %v, %v", o, err)
	}
}

// readAs is what a read counts in field of the hash key: its value with
// the weights of its pending fields.
func readAs(mr *miniredis.Miniredis, key, field string) int {
	n, _ := strconv.Atoi(mr.HGet(key, field))
	fields, _ := mr.HKeys(key)
	for _, f := range fields {
		if !IsPending(f) {
			continue
		}
		for interval, w := range Pending(mr.HGet(key, f)) {
			if interval == field {
				n += w
			}
		}
	}
	return n
}

// runFirst runs do once, before the first pipeline that starts with
// the command first.
type runFirst struct {
	first string
	do    func()
	once  *sync.Once
}

func (runFirst) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (runFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h runFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == h.first {
			h.once.Do(h.do)
		}
		return next(ctx, cmds)
	}
}

// The marker of a transaction that takes intervals down lives until the
// latest deadline of the hashes it changes (Keep), for its resends to
// find; others' no longer than before.
func TestMarkerKept(t *testing.T) {
	mr, rdb := clientOf(t, 3)
	ks := keys.Of("p", "r")
	now := time.UnixMilli(1_700_000_000_000)
	mr.SetTime(now)
	mr.HSet("h", "7", "10")
	for _, c := range []struct {
		name string
		n    int
		keep time.Duration
		want time.Duration
	}{
		{"a take-back", -3, 5 * time.Second, 5 * time.Second},
		{"a take-back of hashes that expire sooner", -3, 100 * time.Millisecond, fenceDoneGrace},
		{"an addition", 3, 5 * time.Second, fenceDoneGrace},
	} {
		u := New(ks, true)
		u.Add("hincrby", "h", "7", c.n)
		u.Keep(now.Add(c.keep).UnixMilli())
		mustRun(t, rdb, u)
		if got := mr.TTL(u.Marker); got != c.want {
			t.Errorf("%s: the marker's TTL %v, want %v", c.name, got, c.want)
		}
	}
}

// Any value of a pending field reads without a panic, as weights other
// than 0 only; what a resend writes reads back as the weights it adds.
func FuzzPending(f *testing.F) {
	f.Add("12:3,13:1", "7", 5)
	f.Add(",:,x:-1,:0", "", 1)
	f.Fuzz(func(t *testing.T, value, field string, n int) {
		for _, w := range Pending(value) {
			if w == 0 {
				t.Fatalf("Pending(%q) yields %d", value, w)
			}
		}
		if n <= 0 || n > 1<<30 || field == TotalField || strings.ContainsAny(field, ",:") {
			return // not a weight, or not an interval's field
		}
		cmds := pending("m", 0, [][]any{{"hincrby", "h", field, -n}, {"hincrby", "h", field, -n}})
		got := 0
		for f, w := range Pending(cmds[0][3].(string)) {
			if f == field {
				got += w
			}
		}
		if len(cmds) != 1 || got != -2*n {
			t.Errorf("the resend of two shrinks of %q by %d: %v, reads back %d", field, n, cmds, got)
		}
	})
}

// A Flush of a client's hash, which takes what the hash holds as a read
// counts it out of the resource's and deletes it, beside a guarded
// take-back u of the client's weight (from both hashes) whose resend ran:
// the resource's interval reads what the other clients hold, whatever the
// order of the resend, the Flush and u running late (its guard fails once
// the client's hash is gone).
func TestResendBesideFlush(t *testing.T) {
	ks := keys.Of("p", "r")
	flush := func(t *testing.T, mr *miniredis.Miniredis) {
		fields, _ := mr.HKeys("c")
		for _, f := range fields {
			if _, err := strconv.Atoi(f); err == nil {
				mr.HIncr("h", f, -readAs(mr, "c", f))
			}
		}
		mr.Del("c")
	}
	for _, order := range []string{"resend flush u", "flush resend u", "resend u flush", "u resend flush", "flush u resend"} {
		t.Run(order, func(t *testing.T) {
			mr, rdb := clientOf(t, 3)
			mr.HSet("c", "7", "5") // 2 of it denied
			mr.HSet("c", "i", "x")
			mr.HSet("h", "7", "8") // the client's 5, and 3 of others
			u := New(ks, true)
			u.Guards = []Guard{{Key: "c", Field: "i", Want: []string{"x"}, Cmds: [][]any{{"hincrby", "c", "7", -2}, {"hincrby", "h", "7", -2}}}}
			if o := u.Resolve(rdb, false); o != NotRun {
				t.Fatalf("Resolve = %v", o)
			}
			resend := u.Again(ks)
			for _, step := range strings.Fields(order) {
				switch step {
				case "resend":
					mustRun(t, rdb, resend)
				case "u":
					mustRun(t, rdb, u)
				case "flush":
					flush(t, mr)
				}
			}
			if got := readAs(mr, "h", "7"); got != 3 {
				t.Errorf("h[7] reads %d, want 3: the other clients'", got)
			}
		})
	}
}

// A Markers gives a name to one transaction at a time, gives it again once
// freed, and never again a name whose transaction was not freed (its
// outcome unknown: it may still set its marker late).
func TestMarkersNameOneAtATime(t *testing.T) {
	ks := keys.Of("p", "r")
	m := NewMarkers()
	a, b, unmarked := New(ks, true), New(ks, true), New(ks, false)
	m.Mark(a, ks)
	m.Mark(b, ks)
	m.Mark(unmarked, ks)
	if a.Marker == b.Marker || unmarked.Marker != "" {
		t.Fatalf("two transactions under way share %q, or an unmarked one got %q", a.Marker, unmarked.Marker)
	}
	m.Free(a)
	m.Free(a) // a second Free gives nothing
	c, d := New(ks, true), New(ks, true)
	m.Mark(c, ks)
	m.Mark(d, ks)
	if c.Marker != a.Marker {
		t.Errorf("the freed name %q was not given again: %q", a.Marker, c.Marker)
	}
	if d.Marker == a.Marker || d.Marker == b.Marker {
		t.Errorf("a name given twice: %q (a freed once, b never freed)", d.Marker)
	}
	other := keys.Of("p", "s")
	e := New(other, true)
	m.Mark(e, other)
	if e.Marker == d.Marker || !strings.HasPrefix(e.Marker, other.Fence("")) {
		t.Errorf("another resource's marker %q: not in its keys, or shared with %q", e.Marker, d.Marker)
	}
}
