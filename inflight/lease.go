package inflight

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// A Lease is weight held at a resource until it is released or its
// deadline passes. Its methods are safe for concurrent use.
//
// A nil *Lease, which TryAcquire and AcquireWithin return when there was
// no room, holds nothing: Release, Extend and KeepAlive on it report an
// error matching ErrNotHeld, and its accessors return zero values, so
// that a deferred Release never panics.
type Lease struct {
	limiter  *Limiter
	resource string
	client   string
	token    string // random: what makes the lease unique
	n        int

	mu       sync.Mutex
	deadline time.Time // Redis's clock (the host's, in process)
	ttl      time.Duration
	stop     chan struct{} // closed by Release: ends KeepAlive
	stopped  bool
}

// ID names the lease, for Limiter.Release in another process. It holds
// the resource, the client and the weight, encoded.
func (le *Lease) ID() string {
	if le == nil {
		return ""
	}
	return keys.Encode(le.resource) + "." + keys.Encode(le.client) + "." + le.token + "." + strconv.Itoa(le.n)
}

// Resource, Client and Weight are what the lease holds (zero values for
// a nil Lease).
func (le *Lease) Resource() string { return le.orZero().resource }
func (le *Lease) Client() string   { return le.orZero().client }
func (le *Lease) Weight() int      { return le.orZero().n }

// orZero returns le, or for a nil Lease one that holds nothing, whose
// fields read as zero values.
func (le *Lease) orZero() *Lease {
	if le == nil {
		return &Lease{}
	}
	return le
}

// errNilLease is what the methods of a nil Lease return.
var errNilLease = fmt.Errorf("%w: a nil Lease (none was acquired: no room, or an error)", ErrNotHeld)

// Deadline is when the lease stops counting unless extended, in Redis's
// clock (the host's, in process).
func (le *Lease) Deadline() time.Time {
	if le == nil {
		return time.Time{}
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.deadline
}

func (le *Lease) setDeadline(d time.Time) {
	le.mu.Lock()
	if d.After(le.deadline) {
		le.deadline = d
	}
	le.mu.Unlock()
}

// ParseID reads an ID, as Limiter.Release does. The lease it returns
// belongs to no Limiter: use Limiter.Release.
func ParseID(id string) (*Lease, error) {
	bad := fmt.Errorf("%w: lease id %q: want one that Lease.ID returned", ErrInvalid, id)
	parts := strings.Split(id, ".")
	if len(parts) != 4 || parts[2] == "" {
		return nil, bad
	}
	resource, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	client, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	n, err3 := strconv.Atoi(parts[3])
	if errors.Join(err1, err2, err3) != nil || n < 1 || n > MaxLimit {
		return nil, bad
	}
	le := &Lease{resource: string(resource), client: string(client), token: parts[2], n: n, stop: make(chan struct{})}
	if le.ID() != id { // base64 and numbers have more than one spelling: only ours names a lease
		return nil, bad
	}
	return le, nil
}

func newToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func newLease(l *Limiter, c call) *Lease {
	return &Lease{limiter: l, resource: c.resource, client: c.client, token: newToken(), n: c.n, ttl: c.ttl, stop: make(chan struct{})}
}

// Release gives the lease's weight back, and wakes the first waiter. It
// is idempotent: released twice, or after it expired, it frees nothing
// more and returns an error matching ErrNotHeld or ErrExpired. With a
// ctx that has already ended, it runs anyway, for at most a second, as a
// holder releases on its way out.
func (le *Lease) Release(ctx context.Context) error {
	if le == nil {
		return errNilLease
	}
	if le.limiter == nil {
		return fmt.Errorf("%w: a lease from ParseID: use Limiter.Release", ErrInvalid)
	}
	le.mu.Lock()
	first := !le.stopped
	if first {
		le.stopped = true
		close(le.stop)
	}
	le.mu.Unlock()
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	err := le.limiter.store.release(ctx, le)
	if first {
		le.limiter.observeRelease(le, err) // once a lease: what is held is counted right
	}
	return err
}

// releaseTimeout bounds a Release whose caller's context was cancelled.
const releaseTimeout = time.Second

// Extend moves the lease's deadline to ttl from now (never earlier). A
// lease that expired or was released is not revived: Extend returns an
// error matching ErrExpired or ErrNotHeld.
func (le *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if le == nil {
		return errNilLease
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: Extend(%v): want a time to live of 1ms or more", ErrInvalid, ttl)
	}
	if le.limiter == nil {
		return fmt.Errorf("%w: a lease from ParseID: use Limiter.Release, or extend the Lease that Acquire returned", ErrInvalid)
	}
	return le.limiter.store.extend(ctx, le, ttl)
}

// KeepAlive extends the lease by its time to live every third of it,
// until it is released or ctx ends, so that it lives as long as its
// holder does. An extend that fails for want of Redis is tried again
// until the lease's deadline; the channel gets the error that ended it
// early (the lease was lost: ErrExpired, ErrNotHeld, or Redis failed
// until its deadline) and is closed when KeepAlive stops.
func (le *Lease) KeepAlive(ctx context.Context) <-chan error {
	out := make(chan error, 1)
	if le == nil {
		out <- errNilLease
		close(out)
		return out
	}
	go func() {
		defer close(out)
		every := le.ttl / 3
		for {
			select {
			case <-ctx.Done():
				return
			case <-le.stop:
				return
			case <-time.After(every):
			}
			err := le.keepOnce(ctx)
			switch {
			case err == nil:
				every = le.ttl / 3
			case errors.Is(err, ErrExpired), errors.Is(err, ErrNotHeld), errors.Is(err, ErrInvalid),
				time.Until(le.Deadline()) < 0:
				out <- err
				return
			default:
				every = le.ttl / 10 // Redis failed: again, sooner
			}
		}
	}()
	return out
}

// keepOnce extends the lease once, within a third of its time to live.
func (le *Lease) keepOnce(ctx context.Context) error {
	ectx, cancel := context.WithTimeout(ctx, le.ttl/3)
	defer cancel()
	return le.Extend(ectx, le.ttl)
}
