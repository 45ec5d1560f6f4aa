package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/leakybucket/leakybucket"
	"github.com/redis/go-redis/v9"
)

// TestPeekGCRA: under -strategy gcra peek shows each bucket's weight out
// of its burst and how long until it is empty (its TAT), exactly, on a
// miniredis whose clock stands still. Per(2, time.Second).WithBurst(4)
// drains one every 500ms, PerMinute(100) one every 600ms.
func TestPeekGCRA(t *testing.T) {
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	b, err := leakybucket.New(rdb, leakybucket.WithPrefix("p"), leakybucket.WithStrategy(leakybucket.GCRA),
		leakybucket.PerResource(leakybucket.PerMinute(100)), leakybucket.PerClient(leakybucket.Per(2, time.Second).WithBurst(4)))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := b.AllowN(context.Background(), "r", "alice", 3); err != nil || !res.Allowed {
		t.Fatalf("AllowN(3) = %+v, %v", res, err)
	}
	global := []string{"-redis", "redis://" + mr.Addr(), "-prefix", "p", "-strategy", "gcra", "-resource-limit", "100/1m", "-client-limit", "2/s,burst=4"}
	for _, tc := range []struct {
		n    string
		want string
	}{
		// The client's bucket holds 3 (1.5s of drain): 2 more fit once
		// 1s is left, in 500ms.
		{"2", `rule                           used/burst  remaining  retry after  empty in
per-resource 100 per 1m        3/100       97         0s           1.8s
per-client 2 per 1s (burst 4)  3/4         1          500ms        1.5s
would allow: false
`},
		{"5", `rule                           used/burst  remaining  retry after  empty in
per-resource 100 per 1m        3/100       97         0s           1.8s
per-client 2 per 1s (burst 4)  3/4         1          never        1.5s
would allow: false
`},
	} {
		code, stdout, stderr := cli(append(global, "peek", "-resource", "r", "-client", "alice", "-n", tc.n)...)
		if code != exitOK || stderr != "" || stdout != tc.want {
			t.Errorf("peek -n %s: exit %d, stderr %q, stdout:\n%s\nwant:\n%s", tc.n, code, stderr, stdout, tc.want)
		}
	}
	// Another strategy refuses the burst: bad input, nothing sent.
	before := mr.Keys()
	code, _, stderr := cli("-redis", "redis://"+mr.Addr(), "-prefix", "p", "-client-limit", "2/s,burst=4", "flush", "-resource", "r", "-client", "alice")
	if code != exitUsage || !strings.Contains(stderr, "burst") || strings.Join(mr.Keys(), " ") != strings.Join(before, " ") {
		t.Errorf("a burst under logs: exit %d, stderr %q, keys %q from %q; want exit %d", code, stderr, mr.Keys(), before, exitUsage)
	}
}
