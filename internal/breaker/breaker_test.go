package breaker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

func TestGone(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		gone bool
	}{
		{nil, false},
		{dial, true},
		{fmt.Errorf("wrapped: %w", dial), true},
		{io.EOF, true},
		{syscall.ECONNRESET, true},
		{os.ErrDeadlineExceeded, false},   // a slow server, not a gone one
		{context.DeadlineExceeded, false}, // the caller's deadline
		{redis.ErrClosed, false},          // the client, not the server
		{errors.New("NOPERM no scripts"), false},
	} {
		if got := Gone(c.err); got != c.gone {
			t.Errorf("Gone(%v) = %v, want %v", c.err, got, c.gone)
		}
	}
}

// An open breaker refuses at once with ErrUnavailable and the cause; its
// probe closes it once the server answers.
func TestBreakerOpensAndCloses(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	var bs Breakers
	br := bs.Of(rdb)
	if bs.Of(rdb) != br || br.Admit() != nil || bs.AnyOpen() {
		t.Fatal("a new breaker is not closed, or not one per server")
	}
	cause := fmt.Errorf("%w: %w", ErrUnavailable, syscall.ECONNREFUSED)
	br.Open(cause)
	err := br.Admit()
	if err != nil && (!errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || !Refused(err)) {
		t.Fatalf("Admit while open = %v, want ErrUnavailable with its cause, refused", err)
	}
	late := br.Late(context.DeadlineExceeded)
	if br.Admit() != nil && (!errors.Is(late, context.DeadlineExceeded) || !errors.Is(late, ErrUnavailable)) {
		t.Errorf("Late while open = %v, want the deadline and ErrUnavailable", late)
	}
	deadline := time.Now().Add(5 * time.Second)
	for br.Admit() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the probe did not close the breaker of a server that answers")
		}
		time.Sleep(time.Millisecond)
	}
	if bs.AnyOpen() {
		t.Error("AnyOpen after the probe closed it")
	}
}

// A call that waits suspects again every suspectEvery: a probe that found
// the server there a moment before it went away, which drops the
// suspicions within suspectEvery of it, does not leave the call to wait
// out its deadline. On fake time, with a server that answers PING until
// it is gone, and then refuses.
func TestSuspectingLooksAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var gone atomic.Bool
		dial := func(context.Context, string, string) (net.Conn, error) {
			if gone.Load() {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			}
			c, s := net.Pipe()
			go func() {
				defer s.Close()
				var buf [64]byte
				if _, err := s.Read(buf[:]); err == nil {
					_, _ = io.WriteString(s, "+PONG\r\n")
				}
			}()
			return c, nil
		}
		rdb := redis.NewClient(&redis.Options{Addr: "server", Dialer: dial,
			// Its endpoint detection would resolve the address with DNS,
			// which cannot run inside a synctest bubble.
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
		defer rdb.Close()
		var bs Breakers
		br := bs.Of(rdb)
		br.Suspect() // a slow call: the probe finds the server there
		synctest.Wait()
		gone.Store(true)
		stop := br.Suspecting() // a call waits for the server, now gone
		time.Sleep(SuspectAfter)
		synctest.Wait()
		if br.Admit() != nil {
			t.Fatal("open after SuspectAfter, within suspectEvery of the last probe: want that suspicion dropped")
		}
		time.Sleep(suspectEvery)
		synctest.Wait()
		if br.Admit() == nil {
			t.Error("still closed suspectEvery later: the waiting call did not suspect again")
		}
		stop()
		gone.Store(false) // the probe finds it back, and ends
		time.Sleep(time.Second)
	})
}
