package txn

import (
	"context"
	"maps"
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
	mr.HSet("h", IncarnationField, "a")
	for _, c := range []struct {
		want    string
		applied bool
	}{{"a", true}, {"b", false}} {
		mr.HSet("h", "n", "10")
		mr.Set("other", "0")
		tx := New(keys.Of("p", "r"), false)
		tx.Add("incr", "other")
		tx.Guards = []Guard{{Key: "h", Want: []string{c.want}, Cmds: [][]any{{"hincrby", "h", "n", -4}}}}
		if o, err := tx.Exec(context.Background(), rdb); o != Ran || err != nil {
			t.Fatalf("want %q: Exec = %v, %v", c.want, o, err)
		}
		n := mr.HGet("h", "n")
		if other, _ := mr.Get("other"); other != "1" || (n == "6") != c.applied {
			t.Errorf("want %q: n = %s, other = %s; guarded applied: want %v", c.want, n, other, c.applied)
		}
	}
}
