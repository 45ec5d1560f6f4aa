package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// server is a throwaway redis-server on a loopback port, with no
// persistence. The library's server denies its default user every script
// command (-@scripting), as a managed plan with Lua off would; the peers'
// server allows them, for redis_rate, ulule/limiter and redislock, which run
// Lua. Each runs alone while the other idles, so neither takes CPU from a
// cell of the other.
type server struct {
	cmd       *exec.Cmd
	dir       string
	addr      string
	version   string
	scripting bool // the default user may run scripts
	exited    chan struct{}
}

// ensureRedis installs Debian's redis-server if it is missing, as
// scripts/test.sh does.
func ensureRedis(log io.Writer) error {
	if _, err := exec.LookPath("redis-server"); err == nil {
		return nil
	}
	fmt.Fprintln(log, "bench: installing redis-server (Debian package)")
	sudo := []string{}
	if os.Geteuid() != 0 {
		sudo = []string{"sudo"}
	}
	run := func(args ...string) error {
		args = append(sudo, args...)
		c := exec.Command(args[0], args[1:]...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		c.Stdout, c.Stderr = log, log
		return c.Run()
	}
	if err := run("apt-get", "update", "-qq"); err != nil {
		return fmt.Errorf("apt-get update: %w", err)
	}
	if err := run("apt-get", "install", "-y", "-qq", "redis-server"); err != nil {
		return fmt.Errorf("apt-get install redis-server: %w", err)
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("redis-server still missing after apt-get: %w", err)
	}
	return nil
}

// redisAvailable reports whether redis-server is on the PATH.
func redisAvailable() bool {
	_, err := exec.LookPath("redis-server")
	return err == nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startServer starts redis-server on a free loopback port, and denies or
// allows scripting to its default user, checking that it really is so.
func startServer(ctx context.Context, scripting bool) (*server, error) {
	var lastErr error
	for range 5 {
		s, err := tryStart(ctx, scripting)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// tryStart starts one server, with configuration args beside the
// defaults (a replica's --replicaof).
func tryStart(ctx context.Context, scripting bool, extra ...string) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leakybucket-bench-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server", append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", dir + "/redis.log",
	}, extra...)...)
	// Its own process group, so that a Ctrl-C in the terminal reaches only
	// this program, which then stops the server; and killed by the kernel
	// if this program dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &server{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		scripting: scripting, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.setup(ctx); err != nil {
		logTail, _ := os.ReadFile(dir + "/redis.log")
		s.stop()
		return nil, fmt.Errorf("redis-server on %s: %w; log:\n%s", s.addr, err, logTail)
	}
	return s, nil
}

func (s *server) setup(ctx context.Context) error {
	admin := s.client(1)
	defer admin.Close()
	if err := s.awaitPing(ctx, admin); err != nil {
		return err
	}
	if err := s.readInfo(ctx, admin); err != nil {
		return err
	}
	if !s.scripting {
		if err := admin.Do(ctx, "acl", "setuser", "default", "-@scripting").Err(); err != nil {
			return fmt.Errorf("ACL SETUSER: %w", err)
		}
	}
	// Prove what the default user may do, then forget any refusal in the
	// ACL log, so that a later entry there is the library's.
	err := admin.Eval(ctx, "return 1", nil).Err()
	switch {
	case s.scripting && err != nil:
		return fmt.Errorf("the default user cannot run scripts, which the peers need: %w", err)
	case !s.scripting && (err == nil || !strings.Contains(err.Error(), "NOPERM")):
		return fmt.Errorf("the default user is not denied scripting: EVAL answered %v", err)
	}
	return admin.Do(ctx, "acl", "log", "reset").Err()
}

// awaitPing waits until the server answers, or exits.
func (s *server) awaitPing(ctx context.Context, admin *redis.Client) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := admin.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return errors.New("exited at start")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING: %w", err)
		}
	}
}

// readInfo learns the version, and checks that the server answering is
// ours: the port was free when freePort looked, but another process may
// have taken it since, and answered the PING in place of ours.
func (s *server) readInfo(ctx context.Context, admin *redis.Client) error {
	info, err := admin.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	pid := ""
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			s.version = v
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid = v
		}
	}
	if pid != strconv.Itoa(s.cmd.Process.Pid) {
		return fmt.Errorf("the server on %s is process %s, not ours (%d): the port was taken meanwhile", s.addr, pid, s.cmd.Process.Pid)
	}
	return nil
}

// client returns a client of the server, as its default user, with pool
// connections at most.
func (s *server) client(pool int) *redis.Client { return s.clientDB(pool, 0) }

// clientDB is client, on logical database db.
func (s *server) clientDB(pool, db int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: s.addr, DB: db, PoolSize: pool, MaxRetries: -1, DisableIdentity: true,
	})
}

// refusedCommands returns the entries of the ACL log since setup: each is a
// command the server refused.
func (s *server) refusedCommands(ctx context.Context) ([]string, error) {
	admin := s.client(1)
	defer admin.Close()
	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s: %s %s (%s, %d times)", e.Username, e.Reason, e.Object, e.Context, e.Count))
	}
	return out, nil
}

// stop ends the server (SIGTERM, then SIGKILL after 5 s) and deletes its
// directory. It may be called more than once.
func (s *server) stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	os.RemoveAll(s.dir)
}
