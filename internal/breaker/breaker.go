// Package breaker tells when a Redis server is gone, and fails fast while
// it is: the breaker.
//
// Once a call finds a Redis server unreachable (a failed
// dial, a connection refused, reset or closed: an error that Unreachable
// reports, but not a read that timed out on an open connection,
// which says the server is slow, not gone), the Bucket
// stops sending it anything: every call to a resource kept there fails at
// once with ErrUnavailable, the last cause in its chain, while a single
// background probe per server dials it and sends PING, waiting a little
// longer after each failure, until it answers. Then calls go to Redis
// again. A call that has waited for Redis longer than SuspectAfter (and
// again every suspectEvery while it waits), or ran out of time while Redis
// was silent, makes the probe look too, at most once per suspectEvery:
// with its default options go-redis retries a refused dial for about
// 0.4 s before it says so (v9.24; v9.23 took 1.7 s), and returns the bare context error to a caller whose
// deadline comes first, while the probe's own dial is refused at once. If
// the server is gone, the breaker opens: the calls still waiting for it
// are cut (see Watch) and fail at once with ErrUnavailable and the cause,
// and a call whose context ends while it waits for Redis gets
// ErrUnavailable and the cause as well as the context's error, so that one
// fault has one class. So an outage costs a process's callers about
// SuspectAfter, once, rather than a deadline each.
//
// The probe dials with the client's own Dialer (TLS included) outside
// go-redis's pool, so that its failures never fill the pool's count of
// failed dials (past PoolSize, go-redis stops dialing and retries only
// once a second). Any reply to its PING counts as an answer, an error
// such as NOAUTH too: the probe asks whether the server is there, not
// whether it is healthy.
package breaker

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
)

// ErrUnavailable: Redis could not be reached or did not answer. The root
// package re-exports it, with its documentation.
var ErrUnavailable = errors.New("leakybucket: redis unavailable")

// Timing of the probe.
const (
	// probeTimeout bounds each probe's dial and PING.
	probeTimeout = 500 * time.Millisecond
	// probeFirstWait is the wait after the first failed probe; each
	// failure doubles it, up to probeMaxWait. It bounds how late the
	// Bucket notices that a server is back: well under the second that
	// an operator expects after a restart.
	probeFirstWait = 5 * time.Millisecond
	probeMaxWait   = 250 * time.Millisecond
	// probeIdle: a probe stops after this long without a call to the
	// server; the next call starts another.
	probeIdle = 10 * time.Second
	// suspectEvery: at most one probe per this long is started by calls
	// that ran out of time, or waited past SuspectAfter, while the breaker
	// was closed.
	suspectEvery = 100 * time.Millisecond
)

// SuspectAfter is how long a decision waits for Redis before it makes the
// probe look: far longer than a healthy round trip, far shorter than any
// deadline worth setting. On a healthy but slow server the probe costs a
// connection and a PING, at most once per suspectEvery.
const SuspectAfter = 10 * time.Millisecond

// Breakers are a Bucket's Breakers, one per server address.
type Breakers struct {
	m sync.Map // address -> *Breaker
}

// Of returns the breaker of node's server, made on first use.
func (bs *Breakers) Of(node *redis.Client) *Breaker {
	opt := node.Options()
	if br, ok := bs.m.Load(opt.Addr); ok {
		return br.(*Breaker)
	}
	fresh := &Breaker{network: opt.Network, addr: opt.Addr, dial: opt.Dialer}
	cut := make(chan struct{})
	fresh.cut.Store(&cut)
	br, _ := bs.m.LoadOrStore(opt.Addr, fresh)
	return br.(*Breaker)
}

// Watch returns a channel that is closed when the breaker opens: a call
// waiting for the server gives up then, as the server is gone. Take it
// before Admit, so that an opening in between is not missed.
func (br *Breaker) Watch() <-chan struct{} { return *br.cut.Load() }

// Refusal is the error of a call cut by the breaker's opening: the
// breaker's, or, should a probe have found the server back meanwhile,
// ErrUnavailable with the cause that opened it.
func (br *Breaker) Refusal() error {
	if err := br.Admit(); err != nil {
		return err
	}
	return &openError{last: *br.last.Load()}
}

// Suspect makes the probe look, unless a late or slow call made it look
// within suspectEvery: a call has waited for the server for SuspectAfter.
func (br *Breaker) Suspect() {
	if br.down.Load() == nil {
		br.startProbe(true)
	}
}

// Suspecting makes the probe look (Suspect) once a call has waited for
// the server for SuspectAfter, and again every suspectEvery while it
// still waits, until stop is called. Not once only: a probe that found
// the server there a moment before it was killed would leave the call to
// wait out its deadline, as the suspicions within suspectEvery of it are
// dropped. The probes stay at most one per suspectEvery.
func (br *Breaker) Suspecting() (stop func()) {
	var mu sync.Mutex // guards t and stopped
	var t *time.Timer
	stopped := false
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(SuspectAfter, func() {
		br.Suspect()
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(suspectEvery)
		}
	})
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// A Breaker is the state of one server.
type Breaker struct {
	network, addr string
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)

	down     atomic.Pointer[error]         // while open: ErrUnavailable and the last cause
	last     atomic.Pointer[error]         // the latest cause, kept once closed again
	cut      atomic.Pointer[chan struct{}] // closed when the breaker opens (see Watch)
	lastCall atomic.Int64                  // unix ns of the latest call refused, while open

	mu        sync.Mutex // guards the fields below, and the changes of down and cut
	probing   bool       // a probe goroutine runs
	suspected time.Time  // when a late call last started a probe
}

// Admit returns nil while the breaker is closed; while open it returns an
// openError at once, and makes sure a probe runs.
func (br *Breaker) Admit() error {
	down := br.down.Load()
	if down == nil {
		return nil
	}
	br.lastCall.Store(time.Now().UnixNano())
	br.startProbe(false)
	return &openError{last: *down}
}

// Late is what a call that ended with err, its context's error, returns:
// while the breaker is open, an error that matches err and ErrUnavailable
// with the last cause, so that one fault has one class; else err, and
// the probe looks at most once per suspectEvery.
func (br *Breaker) Late(err error) error {
	if down := br.down.Load(); down != nil {
		return &lateError{err: err, down: *down}
	}
	br.startProbe(true)
	return err
}

// Refused reports whether err is one an open breaker gave.
func Refused(err error) bool {
	var open *openError
	return errors.As(err, &open)
}

// AnyOpen reports whether the breaker of any server is open.
func (bs *Breakers) AnyOpen() bool {
	open := false
	bs.m.Range(func(_, v any) bool {
		open = v.(*Breaker).down.Load() != nil
		return !open
	})
	return open
}

// Open records err, which matches ErrUnavailable, as the reason calls
// fail, and starts the probe.
func (br *Breaker) Open(err error) {
	br.setDown(err)
	br.lastCall.Store(time.Now().UnixNano())
	br.startProbe(false)
}

// setDown opens the breaker with err as the reason, or closes it if err is
// nil; an opening cuts the calls that wait for the server (see Watch).
func (br *Breaker) setDown(err error) {
	br.mu.Lock()
	defer br.mu.Unlock()
	was := br.down.Load() != nil
	if err == nil {
		br.down.Store(nil)
		if was {
			cut := make(chan struct{})
			br.cut.Store(&cut)
		}
		return
	}
	br.down.Store(&err)
	br.last.Store(&err)
	if !was {
		close(*br.cut.Load())
	}
}

// startProbe starts the probe unless one runs; if suspect (a late call
// asks), only when no late call started one within suspectEvery.
func (br *Breaker) startProbe(suspect bool) {
	br.mu.Lock()
	defer br.mu.Unlock()
	switch {
	case br.probing:
		return
	case suspect && time.Since(br.suspected) < suspectEvery:
		return
	case suspect:
		br.suspected = time.Now()
	}
	br.probing = true
	go br.probe()
}

// probe pings the server until it answers, opening the breaker with each
// failure's cause, and closes it once the server answers; or stops when
// no call has come for probeIdle.
func (br *Breaker) probe() {
	waits := backoff.New(probeFirstWait, probeMaxWait)
	for {
		err := br.ping()
		if !Gone(err) || (br.down.Load() == nil && timedOut(err)) {
			// A suspicion opens the breaker only on a definite answer
			// that nothing listens (refused, reset): a dial that timed
			// out says the machine is loaded as well as it says the
			// server is gone, and the calls wait as for a slow server.
			br.setDown(nil)
			br.stopProbing()
			return
		}
		br.setDown(&probeError{err: err})
		if time.Since(time.Unix(0, br.lastCall.Load())) > probeIdle {
			br.stopProbing()
			return
		}
		time.Sleep(waits.NextBackoff())
	}
}

func (br *Breaker) stopProbing() {
	br.mu.Lock()
	br.probing = false
	br.mu.Unlock()
}

// ping dials the server and sends PING: nil once anything is read back;
// a timeout after the dial succeeded says the server is there but slow
// (see gone).
func (br *Breaker) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	conn, err := br.dial(ctx, br.network, br.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := io.WriteString(conn, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return err
	}
	var reply [64]byte
	_, err = conn.Read(reply[:])
	return err
}

// Gone reports whether err says that the server cannot be reached: a
// failed dial, a connection refused, reset or closed; not a read or write
// that timed out on an open connection, which a slow or paused server
// causes (its calls wait for it, up to their deadlines, as without the
// breaker).
func Gone(err error) bool {
	var opErr *net.OpError
	switch {
	case err == nil:
		return false
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return true
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return false
	}
	return errors.Is(err, ErrUnavailable) || Unreachable(err)
}

// timedOut reports whether err is a timeout: of a dial, a read or a
// write.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout())
}

// openError is the error of a call refused by an open breaker: it matches
// ErrUnavailable and the last cause, through last.
type openError struct{ last error }

func (e *openError) Error() string {
	return "leakybucket: redis unavailable (failing fast until it answers a probe): " + strings.TrimPrefix(e.last.Error(), ErrUnavailable.Error()+": ")
}

func (e *openError) Unwrap() error { return e.last }

// probeError is a failed probe's error: ErrUnavailable with its cause.
type probeError struct{ err error }

func (e *probeError) Error() string { return ErrUnavailable.Error() + ": " + e.err.Error() }

func (e *probeError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// lateError is a context's error that ended a call while the server was
// known to be down: errors.Is matches both, so it is ErrUnavailable with
// the cause, and a deadline.
type lateError struct{ err, down error }

func (e *lateError) Error() string {
	return e.err.Error() + " (" + strings.TrimPrefix(e.down.Error(), "leakybucket: ") + ")"
}

func (e *lateError) Unwrap() []error { return []error{e.err, e.down} }

// Unreachable reports whether err says that Redis could not be reached or
// did not answer, rather than that it answered with an error.
func Unreachable(err error) bool {
	var netErr net.Error
	var redisErr redis.Error
	switch {
	case errors.As(err, &redisErr):
		return false // Redis answered
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// The caller's own deadline, unless the I/O layer reports it as a
		// timeout too (ContextTimeoutEnabled): then the server was slow.
		return errors.As(err, &netErr) && netErr.Timeout()
	case errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrPoolExhausted):
		return true
	}
	return false
}
