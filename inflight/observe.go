package inflight

import "time"

// An Observer is told what a Limiter did, for metrics (see the
// otelmetrics package). Its methods are called synchronously, from the
// goroutine that made the call: they must be quick.
type Observer interface {
	// Acquired: a lease of weight n was acquired at resource, after
	// waiting waited (0 for TryAcquire).
	Acquired(resource string, n int, waited time.Duration)
	// Refused: an acquisition of weight n got nothing: TryAcquire found
	// no room, or Acquire's context ended (err), or Redis failed (err).
	Refused(resource string, n int, err error)
	// Released: a lease of weight n was released, by its first Release
	// (later ones are not reported); err is Release's.
	Released(resource string, n int, err error)
}

func (l *Limiter) observe(c call, ok bool, waited time.Duration, err error) {
	o := l.cfg.observer
	switch {
	case o == nil:
	case ok:
		o.Acquired(c.resource, c.n, waited)
	default:
		o.Refused(c.resource, c.n, err)
	}
}

func (l *Limiter) observeRelease(le *Lease, err error) {
	if o := l.cfg.observer; o != nil {
		o.Released(le.resource, le.n, err)
	}
}
