package inflight

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// local keeps leases in this process: one lock, the leases of each
// resource, and its waiters in order of arrival.
type local struct {
	cfg config
	mu  sync.Mutex // guards resources
	res map[string]*localResource
}

type localResource struct {
	leases map[string]*localLease // by token
	queue  []*localWaiter         // in order of arrival
}

type localLease struct {
	client   string
	n        int
	deadline time.Time
}

type localWaiter struct {
	wake chan struct{} // buffered: a wake is never lost
}

func newLocal(cfg config) *local { return &local{cfg: cfg, res: map[string]*localResource{}} }

// resourceOf returns resource's state, made on first use; l.mu is held.
func (l *local) resourceOf(resource string) *localResource {
	r := l.res[resource]
	if r == nil {
		r = &localResource{leases: map[string]*localLease{}}
		l.res[resource] = r
	}
	return r
}

// forget drops resource's state once it holds nothing; l.mu is held.
func (l *local) forget(resource string, r *localResource) {
	if len(r.leases) == 0 && len(r.queue) == 0 {
		delete(l.res, resource)
	}
}

// expire drops the leases whose deadline passed, and returns the
// earliest deadline left (zero if none).
func (r *localResource) expire(now time.Time) time.Time {
	var earliest time.Time
	for token, le := range r.leases {
		switch {
		case le.deadline.Before(now):
			delete(r.leases, token)
		case earliest.IsZero() || le.deadline.Before(earliest):
			earliest = le.deadline
		}
	}
	return earliest
}

// fits reports whether weight n of client fits under every limit.
func (r *localResource) fits(cfg config, client string, n int) bool {
	total, mine := 0, 0
	for _, le := range r.leases {
		total += le.n
		if le.client == client {
			mine += le.n
		}
	}
	return (cfg.resourceLimit == 0 || total+n <= cfg.resourceLimit) &&
		(cfg.clientLimit == 0 || mine+n <= cfg.clientLimit)
}

// wakeHead wakes the first waiter, if any.
func (r *localResource) wakeHead() {
	if len(r.queue) > 0 {
		select {
		case r.queue[0].wake <- struct{}{}:
		default:
		}
	}
}

func (l *local) acquire(ctx context.Context, c call, wait bool) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.resourceOf(c.resource)
	earliest := r.expire(time.Now())
	if len(r.queue) == 0 && r.fits(l.cfg, c.client, c.n) {
		return l.grant(r, c), nil
	}
	if !wait {
		l.forget(c.resource, r)
		return nil, nil
	}
	w := &localWaiter{wake: make(chan struct{}, 1)}
	r.queue = append(r.queue, w)
	for {
		if le, err := l.waitOnce(ctx, r, w, earliest); le != nil || err != nil {
			return le, err
		}
		earliest = r.expire(time.Now())
		if r.queue[0] == w && r.fits(l.cfg, c.client, c.n) {
			r.queue = r.queue[1:]
			r.wakeHead() // the next may fit too
			return l.grant(r, c), nil
		}
	}
}

// waitOnce waits, without l.mu, until w is woken, the earliest lease
// expires, or ctx ends: then it leaves the queue and returns ctx's
// error. l.mu is held on entry and on return.
func (l *local) waitOnce(ctx context.Context, r *localResource, w *localWaiter, earliest time.Time) (*Lease, error) {
	var expiry <-chan time.Time
	if !earliest.IsZero() {
		t := time.NewTimer(time.Until(earliest) + time.Millisecond)
		defer t.Stop()
		expiry = t.C
	}
	l.mu.Unlock()
	var err error
	select {
	case <-w.wake:
	case <-expiry:
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.mu.Lock()
	if err != nil {
		head := r.queue[0] == w
		r.queue = slices.DeleteFunc(r.queue, func(q *localWaiter) bool { return q == w })
		if head {
			r.wakeHead()
		}
	}
	return nil, err
}

// grant records a lease of c; l.mu is held.
func (l *local) grant(r *localResource, c call) *Lease {
	le := &Lease{resource: c.resource, client: c.client, token: newToken(), n: c.n, ttl: c.ttl, stop: make(chan struct{})}
	le.deadline = time.Now().Add(c.ttl)
	r.leases[le.token] = &localLease{client: c.client, n: c.n, deadline: le.deadline}
	return le
}

// lost is the error of a lease not found: expired if its deadline passed.
func lost(le *Lease, now time.Time) error {
	if le.Deadline().Before(now) && !le.Deadline().IsZero() {
		return fmt.Errorf("%w: %s (deadline %s)", ErrExpired, le.ID(), le.Deadline().Format(time.RFC3339Nano))
	}
	return fmt.Errorf("%w: %s", ErrNotHeld, le.ID())
}

func (l *local) release(_ context.Context, le *Lease) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.res[le.resource]
	if r == nil {
		return lost(le, time.Now())
	}
	defer l.forget(le.resource, r)
	now := time.Now()
	held, ok := r.leases[le.token]
	if !ok || held.n != le.n || held.client != le.client {
		return lost(le, now)
	}
	delete(r.leases, le.token)
	r.wakeHead()
	if held.deadline.Before(now) {
		return fmt.Errorf("%w: %s", ErrExpired, le.ID())
	}
	return nil
}

func (l *local) extend(_ context.Context, le *Lease, ttl time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	r := l.res[le.resource]
	if r == nil {
		return lost(le, now)
	}
	r.expire(now)
	held, ok := r.leases[le.token]
	if !ok {
		return lost(le, now)
	}
	if d := now.Add(ttl); d.After(held.deadline) {
		held.deadline = d
	}
	le.setDeadline(held.deadline)
	return nil
}

func (l *local) held(_ context.Context, resource string) (Usage, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := Usage{Limit: l.cfg.resourceLimit}
	r := l.res[resource]
	if r == nil {
		return u, nil
	}
	r.expire(time.Now())
	u.Waiters = len(r.queue)
	for token, le := range r.leases {
		u.Held += le.n
		u.Holders = append(u.Holders, Holder{Client: le.client, ID: (&Lease{resource: resource, client: le.client, token: token, n: le.n}).ID(), Weight: le.n, Deadline: le.deadline})
	}
	slices.SortFunc(u.Holders, func(a, b Holder) int { return a.Deadline.Compare(b.Deadline) })
	return u, nil
}
