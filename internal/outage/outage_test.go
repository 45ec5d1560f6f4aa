package outage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
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
