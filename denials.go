package leakybucket

import (
	"sync"
	"sync/atomic"
	"time"
)

// The denial cache. A call of weight 1 denied by every rule, all of them
// per-client, changes nothing until the oldest call a rule counts leaves
// its window: no call of that client can be admitted anywhere until then
// (every rule is full), and other clients count elsewhere. So until then
// the same call gets the same Result, its durations moved on by the time
// that passed, and this process answers it without asking Redis, as
// upstash ratelimit's ephemeral cache does. A hammering client then costs
// Redis nothing once denied.
//
// The Result is exact as long as no one flushes the client: this process's
// Flush and FlushAll forget its entries; another process's flush is seen
// once the entry expires, at most maxDenialLife later. WithRecordDenied turns the cache off, as every attempt must count;
// so does a server clock that was not seen moving at this host's pace (a
// test's, which SetTime moves by jumps).

// maxDenials bounds the entries kept; past it, denials are not cached.
const maxDenials = 100_000

// maxDenialLife bounds how long an entry answers: how late a flush made by
// another process (an operator's, through the ops command) is seen. Under
// a second, so that one is seen within a second of the flush even by a
// caller that polls.
const maxDenialLife = 900 * time.Millisecond

// denials is a Bucket's cache.
type denials struct {
	mu      sync.Mutex
	entries map[denialKey]denial
	size    atomic.Int64 // len(entries), read without mu: most Buckets cache nothing
}

// empty reports, without a lock, whether nothing is cached.
func (d *denials) empty() bool { return d.size.Load() == 0 }

type denialKey struct{ resource, client string }

type denial struct {
	res   Result
	at    time.Time // when res was decided (monotonic)
	until time.Time // when a rule's oldest call leaves
}

// cacheable reports how long res stays the answer to its call: until the
// shortest RetryAfter of its rules, if every rule is per-client and denied
// a call of weight 1.
func cacheable(res Result, n int, recordDenied bool) (time.Duration, bool) {
	if n != 1 || recordDenied || res.Allowed || len(res.DeniedBy) != len(res.Rules) {
		return 0, false
	}
	shortest := time.Duration(-1)
	for _, rr := range res.Rules {
		if rr.Rule.Scope != ScopeClient || rr.RetryAfter <= 0 {
			return 0, false
		}
		if shortest < 0 || rr.RetryAfter < shortest {
			shortest = rr.RetryAfter
		}
	}
	return shortest, true
}

// keep caches res, the answer to a call of weight n by client at
// resource made at start, if it stays the answer for a while. Redis
// decided the call after start: counting from start, the entry expires,
// and its durations shrink, a little early, never late.
func (d *denials) keep(resource, client string, n int, recordDenied bool, res Result, start time.Time) {
	valid, ok := cacheable(res, n, recordDenied)
	if !ok {
		return
	}
	now := start
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries == nil {
		d.entries = map[denialKey]denial{}
	}
	if len(d.entries) >= maxDenials {
		d.sweep(now)
		if len(d.entries) >= maxDenials {
			return
		}
	}
	d.entries[denialKey{resource, client}] = denial{res: res, at: now, until: now.Add(min(valid, maxDenialLife))}
	d.size.Store(int64(len(d.entries)))
}

// sweep drops the entries that have expired.
func (d *denials) sweep(now time.Time) {
	for k, e := range d.entries {
		if !now.Before(e.until) {
			delete(d.entries, k)
		}
	}
	d.size.Store(int64(len(d.entries)))
}

// answer returns the cached answer to a call of weight 1 by client at
// resource, its durations moved on, if there is one still valid.
func (d *denials) answer(resource, client string, n int) (Result, bool) {
	if n != 1 || d.empty() {
		return Result{}, false
	}
	now := time.Now()
	d.mu.Lock()
	e, ok := d.entries[denialKey{resource, client}]
	if ok && !now.Before(e.until) {
		delete(d.entries, denialKey{resource, client})
		d.size.Store(int64(len(d.entries)))
		ok = false
	}
	d.mu.Unlock()
	if !ok {
		return Result{}, false
	}
	return e.res.after(now.Sub(e.at)), true
}

// forget drops the entry of client at resource, or, if client is nil,
// every entry of resource.
func (d *denials) forget(resource string, client *string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.entries {
		if k.resource == resource && (client == nil || k.client == *client) {
			delete(d.entries, k)
		}
	}
	d.size.Store(int64(len(d.entries)))
}

// after returns res as it reads elapsed later, with nothing counted or
// gone meanwhile: its durations shortened by elapsed, rounded up to the
// millisecond (Redis's time is in whole milliseconds: never longer than
// Redis would say).
func (res Result) after(elapsed time.Duration) Result {
	elapsed = max(elapsed+time.Millisecond-1, 0).Truncate(time.Millisecond)
	out := res
	out.Rules = make([]RuleResult, len(res.Rules))
	out.DeniedBy = append([]Rule(nil), res.DeniedBy...)
	out.RetryAfter, out.ResetAfter = max(res.RetryAfter-elapsed, 0), max(res.ResetAfter-elapsed, 0)
	for i, rr := range res.Rules {
		rr.RetryAfter, rr.ResetAfter = max(rr.RetryAfter-elapsed, 0), max(rr.ResetAfter-elapsed, 0)
		out.Rules[i] = rr
	}
	return out
}
