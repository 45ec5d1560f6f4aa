package lock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/clock"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// section reads a counter under the lock and writes it back plus one.
type section struct {
	key     string
	read    *redis.StringCmd
	between func() // runs after the reads, before the writes
}

func (s *section) Read(ctx context.Context, pipe redis.Pipeliner) { s.read = pipe.Get(ctx, s.key) }

func (s *section) Finish(ctx context.Context, tx *redis.Tx) error {
	if s.between != nil {
		s.between()
	}
	return nil
}

func (s *section) Write(t *txn.Txn) {
	n, _ := s.read.Int()
	t.Add("set", s.key, n+1)
}

func setup(t *testing.T) (*miniredis.Miniredis, *redis.Client, Options) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	return mr, rdb, Options{TTL: time.Second, Clock: &clock.Clock{}}
}

// Run reads and writes under the lock, and leaves no lock behind.
func TestRunReleases(t *testing.T) {
	mr, rdb, o := setup(t)
	ctx := context.Background()
	for range 3 {
		if err := Run(ctx, rdb, "l", o, &View{}, &section{key: "n"}); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := mr.Get("n"); got != "3" {
		t.Errorf("counter %q after 3 runs, want 3", got)
	}
	if mr.Exists("l") || mr.Exists("l:next") {
		t.Errorf("keys %q left behind", mr.Keys())
	}
}

// A lock held by another is not taken: ErrNotObtained, nothing written,
// the other's lock untouched.
func TestRunHeldByAnother(t *testing.T) {
	mr, rdb, o := setup(t)
	mr.Set("l", "someone else")
	o.Retry = nil // give up at once
	view := &View{}
	err := Run(context.Background(), rdb, "l", o, view, &section{key: "n"})
	if !errors.Is(err, ErrNotObtained) {
		t.Fatalf("error %v, want ErrNotObtained", err)
	}
	if mr.Exists("n") {
		t.Error("wrote without the lock")
	}
	if got, _ := mr.Get("l"); got != "someone else" || !view.Contended() {
		t.Errorf("lock %q, contended %v: want the other's lock, seen contended", got, view.Contended())
	}
}

// A lock lost between the reads and the release (it expired, another took
// it) writes nothing: ErrExpired.
func TestRunLostLock(t *testing.T) {
	mr, rdb, o := setup(t)
	s := &section{key: "n", between: func() { mr.Set("l", "someone else") }}
	if err := Run(context.Background(), rdb, "l", o, &View{}, s); !errors.Is(err, ErrExpired) {
		t.Fatalf("error %v, want ErrExpired", err)
	}
	if mr.Exists("n") {
		t.Error("wrote after losing the lock")
	}
	if got, _ := mr.Get("l"); got != "someone else" {
		t.Errorf("the new holder's lock is now %q", got)
	}
}

// slowSection outlives its lock: Finish waits for Redis (as for one of
// the client's pooled connections) until the lock's holding context ends.
type slowSection struct{ section }

func (s *slowSection) Finish(ctx context.Context, _ *redis.Tx) error {
	<-ctx.Done()
	return ctx.Err()
}

// A decision that outlives its lock, with Redis up and no deadline of the
// caller's, fails with ErrExpired (keeping the cause) and writes nothing:
// it is not an outage, nor a caller's timeout.
func TestRunOutlivesLock(t *testing.T) {
	mr, rdb, o := setup(t)
	o.TTL = 10 * time.Millisecond
	err := Run(context.Background(), rdb, "l", o, &View{}, &slowSection{section{key: "n"}})
	if !errors.Is(err, ErrExpired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want ErrExpired with the lock's deadline as its cause", err)
	}
	if mr.Exists("n") {
		t.Error("wrote after the lock expired")
	}
}

// With Acks, the writes and the release are followed by WAIT in the same
// round trip: while enough replicas acknowledge, Run returns nil; when too
// few do, the writes ran and the lock is free, and the error matches
// txn.ErrNotReplicated, for the section to undo them. (miniredis answers
// WAIT with 0, as a server without replicas; a hook answers 1.)
func TestRunAcks(t *testing.T) {
	mr, rdb, o := setup(t)
	o.Acks = txn.Acks{Replicas: 1, Timeout: 10 * time.Millisecond}
	err := Run(context.Background(), rdb, "l", o, &View{}, &section{key: "n"})
	if !errors.Is(err, txn.ErrNotReplicated) {
		t.Fatalf("no replica: error %v, want ErrNotReplicated", err)
	}
	if got, _ := mr.Get("n"); got != "1" || mr.Exists("l") {
		t.Errorf("no replica: counter %q, keys %q: want the write made and the lock free", got, mr.Keys())
	}
	mr.Server().SetPreHook(func(c *server.Peer, cmd string, args ...string) bool {
		if strings.EqualFold(cmd, "wait") {
			c.WriteInt(1)
			return true
		}
		return false
	})
	if err := Run(context.Background(), rdb, "l", o, &View{}, &section{key: "n"}); err != nil {
		t.Fatalf("one replica acknowledges: %v", err)
	}
	if got, _ := mr.Get("n"); got != "2" || mr.Exists("l") {
		t.Errorf("one replica: counter %q, keys %q", got, mr.Keys())
	}
}
