// Package demo is what the example programs share: a Redis to run on, a
// clock to wait with, and the -strategy flag's names.
//
// A program runs on an embedded miniredis by default, whose clock is
// simulated: it starts at Start and moves only when the program sleeps, at
// once, so a demo of minutes runs in a moment. With REDIS_URL set
// (redis://host:port/db) it runs on that server and sleeps for real.
package demo

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// Start is where the embedded Redis's clock starts, on a whole second.
var Start = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

// Connect returns a client of $REDIS_URL, or of an embedded miniredis,
// with where it runs, for a heading, and how to wait.
//
// On the embedded miniredis, sleep advances the server's clock (TIME and
// key expiry) by d at once. On a real server it is time.Sleep that keeps to
// a schedule: it returns d after the previous sleep was due to return, not
// d after it is called, so the time the program's own calls take does not
// add up, and the program's count of the time slept stays within one
// call's latency of the time that passed.
func Connect() (rdb *redis.Client, where string, sleep func(time.Duration), err error) {
	if url := os.Getenv("REDIS_URL"); url != "" {
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", nil, err
		}
		return redis.NewClient(opts), "Redis at " + opts.Addr, scheduled(), nil
	}
	mr, err := miniredis.Run()
	if err != nil {
		return nil, "", nil, err
	}
	rdb, sleep = Embedded(mr)
	return rdb, "embedded miniredis", sleep, nil
}

// Embedded returns a client of mr, whose clock it sets to Start and stops,
// and a sleep that advances that clock by d at once, expiring keys as time
// passing would. Tests use it with miniredis.RunT.
func Embedded(mr *miniredis.Miniredis) (rdb *redis.Client, sleep func(time.Duration)) {
	var mu sync.Mutex
	now := Start
	mr.SetTime(now)
	mr.ClockTTL(true) // TTLs follow SetTime
	sleep = func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(d)
		mr.SetTime(now)
	}
	return redis.NewClient(&redis.Options{Addr: mr.Addr()}), sleep
}

// scheduled returns a time.Sleep that keeps to a schedule starting at its
// first call.
func scheduled() func(time.Duration) {
	var mu sync.Mutex
	var due time.Time
	return func(d time.Duration) {
		mu.Lock()
		if due.IsZero() {
			due = time.Now()
		}
		due = due.Add(d)
		wait := time.Until(due)
		mu.Unlock()
		time.Sleep(wait)
	}
}

// StrategyUsage documents the -strategy flag.
const StrategyUsage = "how the limiter keeps its counts: logs, sortedset or windows (1s precision)"

// Precision is the precision of the strategy named windows.
const Precision = time.Second

// Strategy returns the strategy named by the -strategy flag: logs,
// sortedset, or windows (Windows(Precision)).
func Strategy(name string) (leakybucket.Strategy, error) {
	switch name {
	case "logs":
		return leakybucket.Logs, nil
	case "sortedset":
		return leakybucket.SortedSet, nil
	case "windows":
		return leakybucket.Windows(Precision), nil
	}
	return nil, fmt.Errorf("unknown strategy %q: want logs, sortedset or windows", name)
}

// Strategies are the names Strategy knows, for tests to run them all.
var Strategies = []string{"logs", "sortedset", "windows"}
