package store

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/keys"
	"github.com/leakybucket/leakybucket/internal/limits"
	"github.com/leakybucket/leakybucket/internal/txn"
)

// A SortedSet decision whose reply was lost, and which Redis then showed
// not to have run (its connection refused), sends the take-backs it
// carried again as they were: they are idempotent (ZREM), so
// the first transaction running late after all changes nothing. A resend
// that writes a marker, as Windows' must, would send SET, which a
// SortedSet user may not (docs/least-privilege.md): refused, the
// take-back would be lost, and its calls counted for their window.
func TestSortedSetResendsWhatItCarriedAsItWas(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	sent := &refusedPings{}
	rdb.AddHook(sent)
	ks := keys.Of("test", "r")
	s := NewSortedSet(Plan{Rules: []limits.Rule{{Requests: 5, Window: 60_000}}}).(sortedSetStore)
	carried := [][]any{{"zrem", "a set", "a member"}} // only the commands sent matter here
	where := Site{Node: rdb, Keys: ks, Markers: txn.NewMarkers()}
	recoverLost(where, s.newBatch(ks, 1, nil), txn.New(ks, false), carried)
	if got := sent.names(); !slices.Equal(got, []string{"multi", "zrem", "exec"}) {
		t.Errorf("sent %v after the verdict; want the carried take-back as it was: [multi zrem exec]", got)
	}
}

// refusedPings answers every PING with a refused connection, as a server
// gone would (resolve's look for a transaction without a marker), and
// keeps the names of the commands of the transactions sent.
type refusedPings struct {
	mu   sync.Mutex
	sent []string
}

func (h *refusedPings) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *refusedPings) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "ping" {
			return next(ctx, cmd)
		}
		refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		cmd.SetErr(refused)
		return refused
	}
}

func (h *refusedPings) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			if cmds[0].Name() == "multi" { // not a new connection's handshake
				h.sent = append(h.sent, c.Name())
			}
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *refusedPings) names() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.sent)
}
