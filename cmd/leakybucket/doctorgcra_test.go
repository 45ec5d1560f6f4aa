package main

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestDoctorGCRA: doctor checks the commands GCRA sends: a user denied
// PEXPIRETIME, or a server without it (older than Redis 7.0, here one
// that renamed it away), fails the acl check, which names it; -replicas
// is bad input under gcra, which refuses WithReplicas.
func TestDoctorGCRA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-servers")
	}
	addr := server(t, safe...)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.Do(context.Background(), "acl", "setuser", "nopx", "on", ">pw", "~*", "&*", "+@all", "-pexpiretime").Err(); err != nil {
		t.Fatal(err)
	}
	code, lines := doctorRun(t, "redis://"+addr, "-strategy", "gcra")
	want(t, lines, "acl", `OK user "default" may run every command the gcra strategy sends`)
	if code != exitOK {
		t.Errorf("default user: exit %d, want 0: %v", code, lines)
	}
	code, lines = doctorRun(t, "redis://nopx:pw@"+addr, "-strategy", "gcra")
	want(t, lines, "acl", `FAIL user "nopx" may not run PEXPIRETIME, which the gcra strategy sends`)
	if code != exitFail {
		t.Errorf("a user denied PEXPIRETIME: exit %d, want %d", code, exitFail)
	}
	old := server(t, append([]string{"--rename-command", "pexpiretime", ""}, safe...)...)
	code, lines = doctorRun(t, "redis://"+old, "-strategy", "gcra")
	want(t, lines, "acl", "FAIL this server has no PEXPIRETIME, which the gcra strategy sends; fix: Redis 7.0 or later")
	if code != exitFail {
		t.Errorf("a server without PEXPIRETIME: exit %d, want %d", code, exitFail)
	}
	code, lines = doctorRun(t, "redis://"+old)
	want(t, lines, "acl", `OK user "default" may run every command the logs strategy sends`)
	if code != exitOK {
		t.Errorf("logs on a server without PEXPIRETIME: exit %d, want 0: %v", code, lines)
	}
	code, stdout, stderr := cli("-redis", "redis://"+addr, "-strategy", "gcra", "doctor", "-replicas", "1")
	if code != exitUsage || stdout != "" || !strings.Contains(stderr, "refuses WithReplicas") {
		t.Errorf("-replicas 1 under gcra: exit %d, stdout %q, stderr %q; want %d", code, stdout, stderr, exitUsage)
	}
}

// Under gcra, a primary with replicas warns of the failover's loss and
// advises min-replicas-*, not WithReplicas, which GCRA refuses.
func TestReplicationVerdictGCRA(t *testing.T) {
	level, text := replicationVerdict(0, 1, 1, 0, false)
	if level != levelWarn || strings.Contains(text, "WithReplicas(") || !strings.Contains(text, "min-replicas-to-write") {
		t.Errorf("gcra, one replica: %s %q", level, text)
	}
	if level, text := replicationVerdict(0, 1, 1, 0, true); level != levelWarn || !strings.Contains(text, "WithReplicas(1, timeout)") {
		t.Errorf("logs, one replica: %s %q", level, text)
	}
}
