// Package stall measures the time in which a process could not run: how
// late the scheduler wakes a goroutine that sleeps a millisecond at a
// time. The timing tests subtract it from a call's wall time, so that a
// loaded machine (a CPU hog beside the tests) cannot fail them while a
// call that waits for the network still does: what is left is the time
// the code under test controls.
package stall

import (
	"sync"
	"time"
)

// A Meter records the stalls from Start until Close.
type Meter struct {
	mu    sync.Mutex // guards wakes
	wakes []wake
	stop  chan struct{}
	done  sync.WaitGroup
}

// wake is one sleep: when it was due to end, and when it did.
type wake struct{ due, woke time.Time }

// Start starts a Meter.
func Start() *Meter {
	m := &Meter{stop: make(chan struct{})}
	m.done.Add(1)
	go m.run()
	return m
}

func (m *Meter) run() {
	defer m.done.Done()
	for {
		select {
		case <-m.stop:
			return
		default:
		}
		due := time.Now().Add(time.Millisecond)
		time.Sleep(time.Millisecond)
		m.mu.Lock()
		m.wakes = append(m.wakes, wake{due: due, woke: time.Now()})
		m.mu.Unlock()
	}
}

// Close stops the Meter.
func (m *Meter) Close() {
	close(m.stop)
	m.done.Wait()
}

// During returns how long the process could not run within [start, end]:
// the part of each stall that overlaps it, summed. A call that waits for
// the network leaves the process idle, so the meter wakes on time and
// nothing of that wait is subtracted; a call that a loaded machine
// descheduled several times loses each of those stalls, not only the
// longest. A wake later than slack is a stall; below it is the timer's
// own lateness, counted as run time so that it cannot hide a wait.
func (m *Meter) During(start, end time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var stalled time.Duration
	for _, w := range m.wakes {
		if w.woke.Sub(w.due) <= slack {
			continue
		}
		from, to := later(w.due, start), earlier(w.woke, end)
		if to.After(from) {
			stalled += to.Sub(from)
		}
	}
	return stalled
}

// slack is how late a timer may wake a goroutine on an idle machine.
const slack = time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
