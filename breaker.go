package leakybucket

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/backoff"
)

// The breaker. Once a call finds a Redis server unreachable (a failed
// dial, a connection refused, reset or closed: an error that classify maps
// to ErrUnavailable, but not a read that timed out on an open connection,
// which says the server is slow, not gone), the Bucket
// stops sending it anything: every call to a resource kept there fails at
// once with ErrUnavailable, the last cause in its chain, while a single
// background probe per server dials it and sends PING, waiting a little
// longer after each failure, until it answers. Then calls go to Redis
// again. A call that ran out of time while Redis was silent (go-redis's
// dial retries can take a whole deadline and return the bare context
// error) makes the probe look too, at most once per suspectEvery: if the
// server is gone, the breaker opens, and from then on a call whose context
// ends while it waits for Redis gets ErrUnavailable and the cause as well
// as the context's error, so that one fault has one class.
//
// The probe dials with the client's own Dialer (TLS included) outside
// go-redis's pool, so that its failures never fill the pool's count of
// failed dials (past PoolSize, go-redis stops dialing and retries only
// once a second). Any reply to its PING counts as an answer, an error
// such as NOAUTH too: the probe asks whether the server is there, not
// whether it is healthy.

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
	// that ran out of time while the breaker was closed.
	suspectEvery = 100 * time.Millisecond
)

// breakers are a Bucket's breakers, one per server address.
type breakers struct {
	m sync.Map // address -> *breaker
}

// of returns the breaker of node's server, made on first use.
func (bs *breakers) of(node *redis.Client) *breaker {
	opt := node.Options()
	if br, ok := bs.m.Load(opt.Addr); ok {
		return br.(*breaker)
	}
	br, _ := bs.m.LoadOrStore(opt.Addr, &breaker{network: opt.Network, addr: opt.Addr, dial: opt.Dialer})
	return br.(*breaker)
}

// admit returns nil if a call may go to node, else the error that the
// call fails with at once.
func (b *Bucket) admit(node *redis.Client) error {
	if b.cfg.noBreaker {
		return nil
	}
	return b.breakers.of(node).admit()
}

// A breaker is the state of one server.
type breaker struct {
	network, addr string
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)

	down     atomic.Pointer[error] // while open: ErrUnavailable and the last cause
	lastCall atomic.Int64          // unix ns of the latest call refused, while open

	mu        sync.Mutex // guards the fields below
	probing   bool       // a probe goroutine runs
	suspected time.Time  // when a late call last started a probe
}

// admit returns nil while the breaker is closed; while open it returns an
// openError at once, and makes sure a probe runs.
func (br *breaker) admit() error {
	down := br.down.Load()
	if down == nil {
		return nil
	}
	br.lastCall.Store(time.Now().UnixNano())
	br.startProbe(false)
	return &openError{last: *down}
}

// open records err, which matches ErrUnavailable, as the reason calls
// fail, and starts the probe.
func (br *breaker) open(err error) {
	br.down.Store(&err)
	br.lastCall.Store(time.Now().UnixNano())
	br.startProbe(false)
}

// startProbe starts the probe unless one runs; if suspect (a late call
// asks), only when no late call started one within suspectEvery.
func (br *breaker) startProbe(suspect bool) {
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
func (br *breaker) probe() {
	waits := backoff.New(probeFirstWait, probeMaxWait)
	for {
		err := br.ping()
		if !gone(err) {
			br.down.Store(nil)
			br.stopProbing()
			return
		}
		down := error(&probeError{err: err})
		br.down.Store(&down)
		if time.Since(time.Unix(0, br.lastCall.Load())) > probeIdle {
			br.stopProbing()
			return
		}
		time.Sleep(waits.NextBackoff())
	}
}

func (br *breaker) stopProbing() {
	br.mu.Lock()
	br.probing = false
	br.mu.Unlock()
}

// ping dials the server and sends PING: nil once anything is read back;
// a timeout after the dial succeeded says the server is there but slow
// (see gone).
func (br *breaker) ping() error {
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

// settle is what a call of the Bucket returns instead of err, the error
// it ended with (called by observe, whatever the observer): err as it is,
// except that a context's error becomes ErrUnavailable too, with the
// cause, while the breaker knows the server is down. It also feeds the
// breaker: an unreachable server opens it, a call that ran out of time
// makes the probe look.
func (b *Bucket) settle(ctx context.Context, resource string, err error) error {
	if !b.feedsBreaker(resource, err) {
		return err
	}
	node, nerr := b.node(ctx, b.keysOf(resource).Slot())
	if nerr != nil {
		return err
	}
	br := b.breakers.of(node)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		if down := br.down.Load(); down != nil {
			return &lateError{err: err, down: *down}
		}
		br.startProbe(true)
	case gone(err):
		br.open(err)
	}
	return err
}

// feedsBreaker reports whether err of a call at resource says anything
// to the breaker: not a local Bucket's, nor one the breaker itself gave,
// nor a busy lock's.
func (b *Bucket) feedsBreaker(resource string, err error) bool {
	if err == nil || b.local != nil || b.cfg.noBreaker || resource == "" {
		return false // before open's address is taken: that allocates
	}
	var open *openError
	return !errors.As(err, &open) && !errors.Is(err, ErrLockNotObtained)
}

// gone reports whether err says that the server cannot be reached: a
// failed dial, a connection refused, reset or closed; not a read or write
// that timed out on an open connection, which a slow or paused server
// causes (its calls wait for it, up to their deadlines, as without the
// breaker).
func gone(err error) bool {
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
	return errors.Is(err, ErrUnavailable) || unreachable(err)
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
