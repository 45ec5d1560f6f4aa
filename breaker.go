package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/lock"
)

// The breaker of each server (see package breaker): a call to a server
// found gone fails at once with ErrUnavailable until a probe finds it
// back.

// admit returns nil if a call may go to node, else the error that the
// call fails with at once.
func (r *remote) admit(node *redis.Client) error {
	if r.cfg.noBreaker {
		return nil
	}
	return r.breakers.Of(node).Admit()
}

// breakerOf returns the breaker of the server that holds resource, or nil
// WithoutBreaker.
func (r *remote) breakerOf(ctx context.Context, resource string) (*breaker.Breaker, error) {
	if r.cfg.noBreaker {
		return nil, nil
	}
	node, err := r.node(ctx, r.keysOf(resource).Slot())
	if err != nil {
		return nil, classify(err)
	}
	return r.breakers.Of(node), nil
}

// watch returns the breaker of the server that holds resource (nil
// WithoutBreaker) and a channel that closes when it opens, or the error
// that a call to it fails with at once: the breaker is open.
func (r *remote) watch(ctx context.Context, resource string) (*breaker.Breaker, <-chan struct{}, error) {
	br, err := r.breakerOf(ctx, resource)
	if err != nil || br == nil {
		return nil, nil, err
	}
	cut := br.Watch() // before Admit: an opening in between cuts the call
	if err := br.Admit(); err != nil {
		return nil, nil, err
	}
	return br, cut, nil
}

// guarded runs f, the work of a call at resource that reads or flushes
// (PeekN, Usage, Flush, FlushAll), as a decision runs (see decide and
// decideBatch): at once ErrUnavailable while the breaker of its server is
// open; the probe looks once it has waited SuspectAfter (Suspecting); and it is cut
// short, with ErrUnavailable and the cause, should the breaker open
// meanwhile. It returns by ctx's deadline (see bounded).
func guarded[T any](ctx context.Context, r *remote, resource string, f func(context.Context, *lock.View) (T, error)) (T, error) {
	var zero T
	br, cut, err := r.watch(ctx, resource)
	if err != nil {
		return zero, err
	}
	if br != nil {
		defer br.Suspecting()()
	}
	v, err := bounded(ctx, cut, f)
	if errors.Is(err, batch.ErrCut) {
		return zero, br.Refusal()
	}
	return v, err
}

// finalError is what a call of the Bucket returns instead of err, the error
// it ended with (called by observe, whatever the observer): err as it is,
// except that a context's error becomes ErrUnavailable too, with the
// cause, while the breaker knows the server is down. It also feeds the
// breaker: an unreachable server opens it, a call that ran out of time
// makes the probe look.
func (r *remote) finalError(ctx context.Context, resource string, err error) error {
	if !r.feedsBreaker(resource, err) {
		return err
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		r.gone(ctx, resource, err)
		return err
	}
	node, nerr := r.node(ctx, r.keysOf(resource).Slot())
	if nerr != nil {
		return err
	}
	return r.breakers.Of(node).Late(err)
}

// gone reports whether err, the error of a call at resource, says that
// the server that holds it is gone: the breaker refused the call or cut
// it, or the call found the server unreachable (breaker.Gone), which opens
// the breaker.
func (r *remote) gone(ctx context.Context, resource string, err error) bool {
	if breaker.Refused(err) {
		return true
	}
	if !r.feedsBreaker(resource, err) || !breaker.Gone(err) {
		return false
	}
	node, nerr := r.node(ctx, r.keysOf(resource).Slot())
	if nerr != nil {
		return false
	}
	r.breakers.Of(node).Open(err)
	return true
}

// feedsBreaker reports whether err of a call at resource says anything
// to the breaker: not one the breaker itself gave, nor a busy lock's, nor
// a decision its replicas did not acknowledge (WithReplicas). The breaker
// asks whether the server is there, and it is: a probe's PING would close
// the breaker at once, after it had cut every call in flight, those whose
// replicas would have acknowledged included. A replica that stops
// acknowledging costs each call its wait, which WithReplicas bounds.
func (r *remote) feedsBreaker(resource string, err error) bool {
	if err == nil || r.cfg.noBreaker || resource == "" {
		return false // before Refused's address is taken: that allocates
	}
	return !breaker.Refused(err) && !errors.Is(err, ErrLockNotObtained) && !errors.Is(err, ErrNotReplicated)
}

// classify turns an error of a Redis call into what the caller is told:
// nil stays nil; the lock's own errors and ErrUnavailable pass as they are;
// a failure to reach Redis becomes ErrUnavailable with its cause, and so
// does a decision its replicas did not acknowledge (ErrNotReplicated);
// any other Redis error (NOPERM, LOADING, MOVED...) is wrapped with the
// package prefix, its cause kept.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLockNotObtained), errors.Is(err, ErrLockExpired), errors.Is(err, ErrUnavailable):
		return err
	case errors.Is(err, ErrNotReplicated):
		return &notDurable{err}
	case breaker.Unreachable(err):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case strings.HasPrefix(err.Error(), "leakybucket: "):
		return err // ours already
	}
	return fmt.Errorf("leakybucket: %w", err)
}

// notDurable is the error of a decision its replicas did not acknowledge:
// it matches ErrUnavailable, and ErrNotReplicated with its detail.
type notDurable struct{ err error }

func (e *notDurable) Error() string {
	return ErrUnavailable.Error() + ": " + strings.TrimPrefix(e.err.Error(), "leakybucket: ")
}

func (e *notDurable) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// bounded runs f and returns its result or, if ctx ends first, ctx's
// error at once (ErrLockNotObtained if f last saw the lock held by another
// holder), or batch.ErrCut if cut closes first (the breaker opened: see
// guarded): f then goes on in the background until it notices, so a call
// never overruns its deadline while Redis is slow or a lock is released.
// A call whose context has already ended sends nothing.
func bounded[T any](ctx context.Context, cut <-chan struct{}, f func(ctx context.Context, view *lock.View) (T, error)) (T, error) {
	var zero T
	if ctx.Err() != nil {
		return zero, batch.GivenUp(ctx, false, nil)
	}
	type outcome struct {
		v   T
		err error
	}
	view := &lock.View{}
	done := make(chan outcome, 1)
	go func() {
		v, err := f(ctx, view)
		done <- outcome{v, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
	case <-cut:
	}
	select {
	case o := <-done:
		return o.v, o.err // it finished meanwhile
	default:
	}
	if ctx.Err() != nil {
		return zero, batch.GivenUp(ctx, view.Contended(), nil)
	}
	return zero, batch.ErrCut
}
