// Package denials caches the answers that cannot change for a while: a
// call of weight 1 denied by every rule, all of them per-client, changes
// nothing until the oldest call a rule counts leaves its window: no call
// of that client can be admitted anywhere until then (every rule is
// full), and other clients count elsewhere. So until then the same call
// gets the same answer, its durations moved on by the time that passed,
// and the process answers it without asking Redis, as upstash
// ratelimit's ephemeral cache does. A hammering client then costs Redis
// nothing once denied.
//
// The answer is exact as long as no one flushes the client: this
// process's flushes forget its entries (Forget); another process's flush
// is seen once the entry expires, at most MaxLife later.
package denials

import (
	"sync"
	"sync/atomic"
	"time"
)

// maxEntries bounds the entries kept; past it, denials are not cached.
const maxEntries = 100_000

// MaxLife bounds how long an entry answers once its answer arrived: how
// late a flush made by another process (an operator's, through the ops
// command) is seen. Under a second, so that one is seen within a second
// of the flush even by a caller that polls (plus however long the answer
// took to arrive: counted from the call's start, a crowd whose decisions
// queue for most of a second would cache answers that expire at once,
// and ask Redis again, and queue longer).
const MaxLife = 900 * time.Millisecond

// A Cache holds answers R by resource and client. Its zero value is
// empty and ready.
type Cache[R any] struct {
	mu      sync.Mutex
	entries map[key]entry[R]
	size    atomic.Int64 // len(entries), read without mu: most Buckets cache nothing
}

type key struct{ resource, client string }

type entry[R any] struct {
	res   R
	at    time.Time // when res was decided (monotonic)
	until time.Time // when it stops being the answer
}

// Empty reports, without a lock, whether nothing is cached.
func (c *Cache[R]) Empty() bool { return c.size.Load() == 0 }

// Keep caches res, the answer to a call by client at resource made at
// start, for valid, and at most MaxLife from now. Redis decided the call
// after start: counting from start, the entry expires, and the elapsed
// time Answer reports is, a little long, never short.
func (c *Cache[R]) Keep(resource, client string, res R, valid time.Duration, start time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[key]entry[R]{}
	}
	if len(c.entries) >= maxEntries {
		c.sweep(start)
		if len(c.entries) >= maxEntries {
			return
		}
	}
	until := start.Add(valid)
	if latest := time.Now().Add(MaxLife); latest.Before(until) {
		until = latest
	}
	c.entries[key{resource, client}] = entry[R]{res: res, at: start, until: until}
	c.size.Store(int64(len(c.entries)))
}

// sweep drops the entries that have expired. c.mu is held.
func (c *Cache[R]) sweep(now time.Time) {
	for k, e := range c.entries {
		if !now.Before(e.until) {
			delete(c.entries, k)
		}
	}
	c.size.Store(int64(len(c.entries)))
}

// Answer returns the cached answer to a call by client at resource, if
// one is still valid, and how long ago it was decided.
func (c *Cache[R]) Answer(resource, client string) (res R, elapsed time.Duration, ok bool) {
	if c.Empty() {
		return res, 0, false
	}
	now := time.Now()
	k := key{resource, client}
	c.mu.Lock()
	e, ok := c.entries[k]
	if ok && !now.Before(e.until) {
		delete(c.entries, k)
		c.size.Store(int64(len(c.entries)))
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return res, 0, false
	}
	return e.res, now.Sub(e.at), true
}

// Forget drops the entry of client at resource, or, if client is nil,
// every entry of resource.
func (c *Cache[R]) Forget(resource string, client *string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.entries {
		if k.resource == resource && (client == nil || k.client == *client) {
			delete(c.entries, k)
		}
	}
	c.size.Store(int64(len(c.entries)))
}
