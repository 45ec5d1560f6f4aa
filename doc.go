// Package leakybucket rate-limits requests across every instance of a
// service through one shared Redis, without Lua scripting, so it works where
// EVAL is denied by ACL (-@scripting), renamed, or disabled by a managed
// plan.
//
// A Bucket applies rules, per resource (PerResource: one count shared by
// all clients) and per client (PerClient: one count per (resource, client)),
// each a sliding window of Requests per Window. All rules are decided
// together and all-or-nothing: AllowN admits a call of weight n only if
// every rule has room for it, and then records it under every rule. A
// denied call is a Result with Allowed false, never an error.
//
// A Strategy decides how the counts are kept. SortedSet (a sliding log
// per rule, in a sorted set) and Windows(precision) (per-interval
// weights in a hash; a rule may carry a precision of its own, and under
// FixedWindows a rule without one is a fixed window) decide in one
// MULTI/EXEC without a lock: the
// transaction records the call and returns the counts, and the call is
// decided from what it returned (docs/design.md argues why that never
// admits past a limit). Logs, the default and the original design, writes
// one expiring access-log key per batch of admitted calls (SET PXAT) and
// counts the live logs with SCAN MATCH under a lock built from SET NX and
// fenced by WATCH + MULTI/EXEC: two round trips, and SCAN walks the whole
// database, so keep its keys in a logical database of their own. Time
// comes from Redis: the server's own clock, or this host's estimate of it
// from TIME replies. Concurrent calls to one resource are batched into one
// round. The README and docs/ describe the design in full.
//
// The name: every admitted request fills the bucket by its weight and leaks
// out of it exactly one window later, when Redis expires its log.
package leakybucket
