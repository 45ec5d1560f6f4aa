package leakybucket

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/leakybucket/leakybucket/internal/outage"
)

// The breaker of each server (see package outage): a call to a server
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
func (r *remote) breakerOf(ctx context.Context, resource string) (*outage.Breaker, error) {
	if r.cfg.noBreaker {
		return nil, nil
	}
	node, err := r.node(ctx, r.keysOf(resource).Slot())
	if err != nil {
		return nil, classify(err)
	}
	return r.breakers.Of(node), nil
}

// settle is what a call of the Bucket returns instead of err, the error
// it ended with (called by observe, whatever the observer): err as it is,
// except that a context's error becomes ErrUnavailable too, with the
// cause, while the breaker knows the server is down. It also feeds the
// breaker: an unreachable server opens it, a call that ran out of time
// makes the probe look.
func (r *remote) settle(ctx context.Context, resource string, err error) error {
	if !r.feedsBreaker(resource, err) {
		return err
	}
	node, nerr := r.node(ctx, r.keysOf(resource).Slot())
	if nerr != nil {
		return err
	}
	br := r.breakers.Of(node)
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return br.Late(err)
	case outage.Gone(err):
		br.Open(err)
	}
	return err
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
	return !outage.Refused(err) && !errors.Is(err, ErrLockNotObtained) && !errors.Is(err, ErrNotReplicated)
}
