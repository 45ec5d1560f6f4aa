//go:build linux

package main

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// server starts a redis-server of the test's own on a free loopback port
// with extra configuration args, and returns its address; it is killed
// when the test ends (and with the test binary: Pdeathsig).
func server(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server is not installed: %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
	for range 3 {
		if addr, ok := tryServer(t, bin, args); ok {
			return addr
		}
	}
	t.Fatal("redis-server would not start on 3 ports in a row")
	return ""
}

// tryServer starts one server on a port that was free a moment ago, and
// reports whether it answered there.
func tryServer(t *testing.T, bin string, args []string) (string, bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log")}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		info, err := rdb.Info(context.Background(), "server").Result()
		if err == nil {
			return addr, strings.Contains(info, "process_id:"+strconv.Itoa(cmd.Process.Pid)+"\r\n")
		}
	}
	return addr, false
}

// noPersistence are the args of a server that saves nothing.
var noPersistence = []string{"--save", "", "--appendonly", "no"}

// safe are the args of a server that passes every check.
var safe = []string{"--save", "", "--appendonly", "yes", "--maxmemory", "512mb", "--maxmemory-policy", "noeviction"}

// doctorRun runs doctor on url with extra flags (global ones, or its
// own), and returns its exit code and output lines by check name.
func doctorRun(t *testing.T, url string, flags ...string) (int, map[string]string) {
	t.Helper()
	code, stdout, stderr := cli(append([]string{"-redis", url, "doctor"}, flags...)...)
	lines := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSuffix(stdout, "\n"), "\n") {
		level, rest, _ := strings.Cut(line, "  ")
		check, text, _ := strings.Cut(strings.TrimSpace(rest), ": ")
		lines[check] = level + " " + text
	}
	if code == exitRedis || code == exitUsage || len(lines) != 8 {
		t.Fatalf("doctor: exit %d, %d checks; stdout:\n%s\nstderr: %s", code, len(lines), stdout, stderr)
	}
	return code, lines
}

// want checks that the line of check starts with prefix (its level and
// the beginning of its text).
func want(t *testing.T, lines map[string]string, check, prefix string) {
	t.Helper()
	if !strings.HasPrefix(lines[check], prefix) {
		t.Errorf("%s: %q, want %q...", check, lines[check], prefix)
	}
}

// TestDoctor runs doctor against servers configured as a limiter must
// not be, and as it should be: each verdict, and the exit status (0 with
// only OK and WARN, 3 with a FAIL).
func TestDoctor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers")
	}
	for _, tc := range []struct {
		name  string
		args  []string
		code  int
		check string
		want  string
	}{
		{"allkeys-lru", append([]string{"--maxmemory-policy", "allkeys-lru"}, noPersistence...), exitFail, "maxmemory-policy", "FAIL allkeys-lru evicts"},
		{"volatile-lru", append([]string{"--maxmemory-policy", "volatile-lru"}, noPersistence...), exitOK, "maxmemory-policy", "WARN volatile-lru evicts keys with a TTL"},
		{"noeviction", safe, exitOK, "maxmemory-policy", "OK noeviction"},
		{"no persistence", noPersistence, exitOK, "persistence", "WARN none: a restart loses every count"},
		{"aof", safe, exitOK, "persistence", "OK AOF on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, lines := doctorRun(t, "redis://"+server(t, tc.args...))
			want(t, lines, tc.check, tc.want)
			if code != tc.code {
				t.Errorf("exit %d, want %d: %v", code, tc.code, lines)
			}
		})
	}
}

// TestDoctorSafe: a server set up as the docs say passes every check.
func TestDoctorSafe(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	_, lines := doctorRun(t, "redis://"+server(t, safe...)+"/3")
	for check, line := range lines {
		if !strings.HasPrefix(line, "OK ") {
			t.Errorf("%s: %q, want OK", check, line)
		}
	}
}

// TestDoctorReplica: a primary with a replica warns of the failover's
// loss, and advises WithReplicas; with -replicas 1 (the service waits for
// its replica) it is OK, with -replicas 2 it fails (every decision would
// fail); the replica itself fails, as the Bucket cannot write there. A
// primary without replicas is OK, unless the service waits for one.
func TestDoctorReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers")
	}
	primary := server(t, safe...)
	host, port, _ := net.SplitHostPort(primary)
	replica := server(t, append([]string{"--replicaof", host, port}, safe...)...)
	rdb := redis.NewClient(&redis.Options{Addr: primary})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := rdb.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not come online: %q, %v", info, err)
		}
	}
	code, lines := doctorRun(t, "redis://"+primary)
	want(t, lines, "replication", "WARN primary with 1 replica(s), 1 online, lag up to")
	if !strings.Contains(lines["replication"], "WithReplicas(1, timeout)") || !strings.Contains(lines["replication"], "min-replicas-max-lag") || code != exitOK {
		t.Errorf("primary: exit %d, replication %q: want 0, and the fixes", code, lines["replication"])
	}
	code, lines = doctorRun(t, "redis://"+primary, "-replicas", "1")
	want(t, lines, "replication", "OK primary with 1 replica(s), 1 online")
	want(t, lines, "acl", `OK user "default" may run every command`)
	if code != exitOK {
		t.Errorf("primary, -replicas 1: exit %d, want 0: %v", code, lines)
	}
	code, lines = doctorRun(t, "redis://"+primary, "-replicas", "2")
	want(t, lines, "replication", "FAIL primary with 1 replica(s), 1 online")
	if code != exitFail {
		t.Errorf("primary, -replicas 2: exit %d, want %d", code, exitFail)
	}
	code, lines = doctorRun(t, "redis://"+server(t, safe...), "-replicas", "1")
	want(t, lines, "replication", "FAIL primary with 0 replica(s), 0 online")
	if code != exitFail {
		t.Errorf("no replica, -replicas 1: exit %d, want %d", code, exitFail)
	}
	code, lines = doctorRun(t, "redis://"+replica)
	want(t, lines, "replication", "FAIL this server is a replica of "+primary)
	if code != exitFail {
		t.Errorf("replica: exit %d, want %d", code, exitFail)
	}
}

// TestDoctorACL: a user denied CONFIG (and INFO) gets "cannot check"
// lines, not a crash; a user denied a command of its strategy fails the
// acl check, which names the command.
func TestDoctorACL(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	addr := server(t, safe...)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	for _, rule := range [][]any{
		{"acl", "setuser", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config", "-info"},
		{"acl", "setuser", "nozadd", "on", ">pw", "~*", "&*", "+@all", "-zadd"},
	} {
		if err := rdb.Do(ctx, rule...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	code, lines := doctorRun(t, "redis://noconfig:pw@"+addr)
	for _, check := range []string{"maxmemory-policy", "memory", "persistence", "replication"} {
		want(t, lines, check, "WARN cannot check: ")
	}
	want(t, lines, "acl", `OK user "noconfig" may run every command`)
	if code != exitOK {
		t.Errorf("a user denied CONFIG: exit %d, want 0: %v", code, lines)
	}
	code, lines = doctorRun(t, "redis://nozadd:pw@"+addr, "-strategy", "sortedset")
	want(t, lines, "acl", `FAIL user "nozadd" may not run ZADD`)
	if code != exitFail {
		t.Errorf("a user denied ZADD: exit %d, want %d", code, exitFail)
	}
	// WAIT only matters for a service WithReplicas.
	if err := rdb.Do(ctx, "acl", "setuser", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	_, lines = doctorRun(t, "redis://nowait:pw@"+addr)
	want(t, lines, "acl", `OK user "nowait" may run every command`)
	_, lines = doctorRun(t, "redis://nowait:pw@"+addr, "-replicas", "1")
	want(t, lines, "acl", `FAIL user "nowait" may not run WAIT`)
}

// TestDoctorAuthError: a server that refuses the user is reported at
// once, with the server's own error, whatever -timeout.
func TestDoctorAuthError(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	addr := server(t, noPersistence...)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	if err := admin.ConfigSet(context.Background(), "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	for _, url := range []string{"redis://" + addr + "/0", "redis://:wrong@" + addr + "/0"} {
		start := time.Now()
		code, _, stderr := cli("-redis", url, "doctor")
		took := time.Since(start)
		if code != exitRedis || !strings.Contains(stderr, "NOAUTH") && !strings.Contains(stderr, "WRONGPASS") || took > time.Second {
			t.Errorf("%s: exit %d after %v, stderr %q; want exit %d with the server's NOAUTH or WRONGPASS within 1s", url, code, took, stderr, exitRedis)
		}
	}
}
