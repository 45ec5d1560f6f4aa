package leakybucket

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/leakybucket/leakybucket/internal/batch"
	"github.com/leakybucket/leakybucket/internal/breaker"
	"github.com/leakybucket/leakybucket/internal/lock"
)

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
