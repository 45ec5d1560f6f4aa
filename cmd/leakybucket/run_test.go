package main

import (
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
)

// cli runs the command in process and returns its exit code and output.
func cli(args ...string) (code int, stdout, stderr string) {
	var out, errOut strings.Builder
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // in stdout
	}{
		{[]string{"-h"}, []string{"Subcommands:", "peek", "flush-all", "-resource-limit", "Exit status"}},
		{[]string{"-help"}, []string{"Subcommands:"}},
		{[]string{"help"}, []string{"Subcommands:"}},
		{[]string{"help", "flush"}, []string{"Usage: leakybucket [global flags] flush -resource R [-client C]", "-redis"}},
		{[]string{"-redis", "redis://nowhere:1", "peek", "-h"}, []string{"peek -resource R [-client C] [-n N]", "-n N", "-strategy"}},
		{[]string{"flush", "-h"}, []string{"Bucket.Flush", "-client"}},
		{[]string{"flush-all", "--help"}, []string{"Bucket.FlushAll", "-resource"}},
	} {
		code, stdout, stderr := cli(tc.args...)
		if code != exitOK || stderr != "" {
			t.Errorf("%q: exit %d, stderr %q; want 0 and nothing", tc.args, code, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("%q: help lacks %q:\n%s", tc.args, w, stdout)
			}
		}
	}
}

// TestBadInput checks that bad input exits 2 with a clear message, before
// the command sends anything to Redis.
func TestBadInput(t *testing.T) {
	mr := miniredis.RunT(t)
	redisFlag := []string{"-redis", "redis://" + mr.Addr() + "/2"}
	// Clipped, so that each case's append copies it.
	rules := slices.Clip(append(redisFlag, "-resource-limit", "100/30m", "-client-limit", "10/1m"))
	for _, tc := range []struct {
		args []string
		want string // in stderr
	}{
		{nil, "no subcommand"},
		{[]string{"frobnicate"}, `unknown subcommand "frobnicate"`},
		{[]string{"help", "frobnicate"}, "want one subcommand"},
		{[]string{"-bogus", "peek"}, "flag provided but not defined: -bogus"},
		{append(rules, "peek", "-resource", "r", "-client", "a", "-bogus"), "flag provided but not defined: -bogus"},
		{append(rules, "peek", "-resource", "r", "-client", "a", "extra"), `unexpected argument "extra"`},
		{append(redisFlag, "-resource-limit", "100", "peek", "-resource", "r"), "want <requests>/<window>"},
		{append(redisFlag, "-client-limit", "0/1m", "peek", "-resource", "r"), "not a positive whole number"},
		{append(redisFlag, "-client-limit", "10/1x", "peek", "-resource", "r"), "not a duration"},
		{append(rules, "-strategy", "leaky", "peek", "-resource", "r", "-client", "a"), `unknown strategy "leaky"`},
		{append(rules, "-strategy", "windows:2m", "peek", "-resource", "r", "-client", "a"), "invalid option"},
		{append(rules, "-prefix", "", "peek", "-resource", "r", "-client", "a"), "empty prefix"},
		{append(rules, "-timeout", "0s", "peek", "-resource", "r", "-client", "a"), "-timeout"},
		{append(redisFlag, "peek", "-resource", "r"), "no rule"},
		{append(rules, "peek", "-client", "a"), "-resource is required"},
		{append(rules, "peek", "-resource", "r"), "-client is required"},
		{append(rules, "peek", "-resource", "r", "-client", "a", "-n", "0"), "invalid weight"},
		{append(rules, "flush", "-client", "a"), "-resource is required"},
		{append(rules, "flush", "-resource", "", "-client", "a"), "-resource is required"},
		{append(rules, "flush", "-resource", "r"), "-client is required"},
		{append(rules, "flush-all"), "-resource is required"},
		{append(rules, "flush-all", "-resource", "r", "-client", "a"), "flag provided but not defined: -client"},
		{append([]string{"-redis", "http://" + mr.Addr()}, "-client-limit", "1/s", "flush-all", "-resource", "r"), "-redis"},
		{append([]string{"-redis", "redis://" + mr.Addr() + "/2", "-cluster", mr.Addr()}, "-client-limit", "1/s", "flush-all", "-resource", "r"), "database 0 only"},
		{append([]string{"-cluster", " , "}, "-client-limit", "1/s", "flush-all", "-resource", "r"), "no host:port"},
	} {
		code, stdout, stderr := cli(tc.args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want %d, nothing, and %q", tc.args, code, stdout, stderr, exitUsage, tc.want)
		}
	}
	if n := mr.CommandCount(); n != 0 {
		t.Errorf("bad input sent %d commands to Redis, want none", n)
	}
}

// TestPeekNever checks that peek of a weight above a rule's limit is no
// error (the library denies it): the rule that can never hold it says
// "never", the other its own wait.
func TestPeekNever(t *testing.T) {
	mr := miniredis.RunT(t)
	code, stdout, stderr := cli("-redis", "redis://"+mr.Addr()+"/2", "-resource-limit", "100/30m", "-client-limit", "10/1m",
		"peek", "-resource", "r", "-client", "a", "-n", "11")
	lines := strings.Split(stdout, "\n")
	if code != exitOK || stderr != "" || len(lines) != 5 ||
		strings.Fields(lines[1])[6] != "0s" || strings.Fields(lines[2])[6] != "never" || lines[3] != "would allow: false" {
		t.Errorf("peek -n 11 of a 10 limit: exit %d, stderr %q, stdout:\n%s\nwant 0s for the resource, never for the client, and would allow: false", code, stderr, stdout)
	}
}

// TestRedisDown checks that a Redis that cannot be reached exits 1.
func TestRedisDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	code, stdout, stderr := cli("-redis", "redis://"+addr, "-timeout", "2s", "-client-limit", "10/1m",
		"flush", "-resource", "r", "-client", "a")
	if code != exitRedis || stdout != "" || !strings.Contains(stderr, "leakybucket flush:") {
		t.Errorf("exit %d, stdout %q, stderr %q; want %d and the error", code, stdout, stderr, exitRedis)
	}
}
