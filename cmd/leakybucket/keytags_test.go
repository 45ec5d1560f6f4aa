package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leakybucket/leakybucket"
)

// TestWarnOtherKeys: peek and flush with a strategy or rules other than
// the Bucket's warn on stderr, naming the tags found under the prefix;
// with the Bucket's own, they say nothing more.
func TestWarnOtherKeys(t *testing.T) {
	e := newE2E(t, "windows:1s", leakybucket.Windows(time.Second))
	e.allow("alice", 3)
	for _, tc := range []struct {
		name string
		args []string
		warn bool
	}{
		{"the Bucket's flags", e.args("peek", "-resource", "r", "-client", "alice"), false},
		{"another strategy", e.args("-strategy", "logs", "peek", "-resource", "r", "-client", "alice"), true},
		{"another window", e.args("-resource-limit", "100/1h", "peek", "-resource", "r", "-client", "alice"), true},
		{"flush with another strategy", e.args("-strategy", "sortedset", "flush", "-resource", "r", "-client", "bob"), true},
	} {
		code, stdout, stderr := cli(tc.args...)
		switch {
		case code != exitOK:
			t.Errorf("%s: exit %d, stderr %q", tc.name, code, stderr)
		case !tc.warn && stderr != "":
			t.Errorf("%s: stderr %q, want nothing", tc.name, stderr)
		case tc.warn && (!strings.Contains(stderr, "warning: no key under") || !strings.Contains(stderr, "w1800000p1000e (")):
			t.Errorf("%s: stderr %q, want a warning naming the Bucket's tag w1800000p1000e...", tc.name, stderr)
		case tc.warn && strings.Contains(stdout, "warning"):
			t.Errorf("%s: the warning went to stdout: %q", tc.name, stdout)
		}
	}
	if keys := e.r.keys(t); !slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(k, ":w1800000p1000e") }) {
		t.Errorf("the Bucket's keys %q lack the tag the test expects", keys)
	}
}
