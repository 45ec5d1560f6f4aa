package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestDoctorDialError: against a port where nothing listens, doctor
// reports the refused dial within a second, whatever -timeout (1 s, the
// default 5 s, and a cluster's node), as peek does: before, it said
// "context deadline exceeded" with -timeout 1s, and "connection refused"
// only after 1.76 s by default.
func TestDoctorDialError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, args := range [][]string{
		{"-redis", "redis://" + addr + "/0", "-timeout", "1s", "doctor"},
		{"-redis", "redis://" + addr + "/0", "doctor"},
		{"-cluster", addr, "doctor"},
	} {
		start := time.Now()
		code, _, stderr := cli(args...)
		took := time.Since(start)
		t.Logf("%q: exit %d after %v: %s", args, code, took, stderr)
		if code != exitRedis || !strings.Contains(stderr, "connection refused") || took > time.Second {
			t.Errorf("%q: exit %d after %v, stderr %q; want exit %d saying \"connection refused\" within 1s", args, code, took, stderr, exitRedis)
		}
	}
}
