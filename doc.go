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
// A Strategy decides how the counts are kept. By default (Logs) each
// admitted call writes one expiring access-log key stamped with Redis time
// (SET PXAT), and rules count the live logs with SCAN MATCH; since SCAN
// walks the whole database, keep the limiter's keys in a logical database
// of their own, or choose SortedSet (a sorted-set sliding log) or
// Windows(precision) (per-interval weights in a hash), whose cost does not
// depend on the database. Under every strategy the count-then-write runs
// under a lock built from SET NX PX and fenced by WATCH + MULTI/EXEC, so a
// holder whose lock expired writes nothing, and an uncontended decision
// costs two round trips. Time comes only from Redis. The README describes
// the design in full.
//
// The name: every admitted request fills the bucket by its weight and leaks
// out of it exactly one window later, when Redis expires its log.
package leakybucket
