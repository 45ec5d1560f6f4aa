package demo

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// On the embedded Redis, the clock starts at Start, stands still, and sleep
// moves TIME and key expiry forward at once.
func TestEmbeddedSleep(t *testing.T) {
	rdb, sleep := Embedded(miniredis.RunT(t))
	defer rdb.Close()
	ctx := context.Background()
	now := func() time.Time {
		t.Helper()
		tm, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	if got := now(); !got.Equal(Start) {
		t.Fatalf("TIME %v, want Start %v", got, Start)
	}
	if err := rdb.Set(ctx, "k", "v", 10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	sleep(9999 * time.Millisecond)
	if n := rdb.Exists(ctx, "k").Val(); n != 1 {
		t.Errorf("the key expired 1ms early")
	}
	sleep(time.Millisecond)
	if got, want := now(), Start.Add(10*time.Second); !got.Equal(want) {
		t.Errorf("TIME %v after sleeping 10s, want %v", got, want)
	}
	if n := rdb.Exists(ctx, "k").Val(); n != 0 {
		t.Errorf("the key outlived its TTL")
	}
	// Sleeping for real would take the 10s slept; a few round trips to
	// miniredis take far less, even on a loaded machine.
	if took := time.Since(began); took >= 10*time.Second {
		t.Errorf("simulated sleeps of 10s took %v", took)
	}
}

// The real-server sleep keeps to its schedule: a late caller sleeps less.
// On fake time (a synctest bubble), so that the answer is exact however
// loaded the machine is.
func TestScheduledSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sleep := scheduled()
		began := time.Now()
		sleep(100 * time.Millisecond)
		time.Sleep(150 * time.Millisecond) // the program's own work, past the next deadline
		sleep(200 * time.Millisecond)      // due at 300ms, not 450ms
		if took := time.Since(began); took != 300*time.Millisecond {
			t.Errorf("took %v, want 300ms", took)
		}
		time.Sleep(250 * time.Millisecond) // the work, to 550ms: past the next two deadlines
		sleep(100 * time.Millisecond)      // due at 400ms: at once
		sleep(100 * time.Millisecond)      // due at 500ms: at once
		sleep(100 * time.Millisecond)      // due at 600ms
		if took := time.Since(began); took != 600*time.Millisecond {
			t.Errorf("took %v, want 600ms: due then, not 850ms", took)
		}
	})
}

func TestConnectEmbedded(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	rdb, where, sleep, err := Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	sleep(time.Hour)
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil || !tm.Equal(Start.Add(time.Hour)) || where != "embedded miniredis" {
		t.Errorf("TIME %v, %v at %q: want Start+1h on the embedded miniredis", tm, err, where)
	}
}

func TestConnectURL(t *testing.T) {
	mr := miniredis.RunT(t)
	t.Setenv("REDIS_URL", "redis://"+mr.Addr()+"/0")
	rdb, where, _, err := Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil || where != "Redis at "+mr.Addr() {
		t.Errorf("ping %v at %q", err, where)
	}
	t.Setenv("REDIS_URL", "mysql://nowhere")
	if _, _, _, err := Connect(); err == nil {
		t.Error("a bad REDIS_URL was accepted")
	}
}

func TestStrategy(t *testing.T) {
	want := map[string]string{"logs": "logs", "sortedset": "sorted set", "windows": "windows(1s)"}
	for _, name := range Strategies {
		s, err := Strategy(name)
		if err != nil || s.String() != want[name] {
			t.Errorf("Strategy(%q) = %v, %v; want %s", name, s, err, want[name])
		}
	}
	if _, err := Strategy("lua"); err == nil {
		t.Error(`Strategy("lua") returned no error`)
	}
}
