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

// The ACL user that runs this library: every command but the scripting ones.
// redis_rate and redislock need EVAL and run as the default user.
const (
	lbUser     = "leakybucket"
	lbPassword = "bench-only-password"
)

// server is a throwaway redis-server on a loopback port: no persistence,
// the DEBUG command allowed from loopback (for DEBUG POPULATE), and the
// leakybucket user denied scripting.
type server struct {
	cmd     *exec.Cmd
	dir     string
	addr    string
	version string
	exited  chan struct{}
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

// startServer starts redis-server on a free loopback port, creates the
// leakybucket user and checks that it is really denied scripting.
func startServer(ctx context.Context) (*server, error) {
	var lastErr error
	for range 5 {
		s, err := tryStart(ctx)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStart(ctx context.Context) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leakybucket-bench-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", dir, "--logfile", dir+"/redis.log",
		"--enable-debug-command", "local",
	)
	// Its own process group, so that a Ctrl-C in the terminal reaches only
	// this program, which then stops the server; and killed by the kernel
	// if this program dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &server{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	if err := s.setup(ctx); err != nil {
		logTail, _ := os.ReadFile(dir + "/redis.log")
		s.stop()
		return nil, fmt.Errorf("redis-server on %s: %w; log:\n%s", s.addr, err, logTail)
	}
	return s, nil
}

func (s *server) setup(ctx context.Context) error {
	admin := s.client("", "", 1)
	defer admin.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := admin.Ping(ctx).Err()
		if err == nil {
			break
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
	// The port was free when freePort looked; another process may have
	// taken it since, and answered the PING in place of ours.
	if pid != strconv.Itoa(s.cmd.Process.Pid) {
		return fmt.Errorf("the server on %s is process %s, not ours (%d): the port was taken meanwhile", s.addr, pid, s.cmd.Process.Pid)
	}
	if err := admin.Do(ctx, "acl", "setuser", lbUser, "reset", "on", ">"+lbPassword,
		"~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		return fmt.Errorf("ACL SETUSER: %w", err)
	}
	// Prove the user cannot run a script, then forget the refusal in the
	// ACL log, so that any later entry there is the library's.
	lb := s.client(lbUser, lbPassword, 1)
	defer lb.Close()
	err = lb.Eval(ctx, "return 1", nil).Err()
	if err == nil || !strings.Contains(err.Error(), "NOPERM") {
		return fmt.Errorf("user %s is not denied scripting: EVAL answered %v", lbUser, err)
	}
	if err := admin.Eval(ctx, "return 1", nil).Err(); err != nil {
		return fmt.Errorf("the default user cannot run scripts, which redis_rate and redislock need: %w", err)
	}
	return admin.Do(ctx, "acl", "log", "reset").Err()
}

// client returns a client of the server as user ("" = default).
func (s *server) client(user, password string, pool int) *redis.Client {
	return newClient(s.addr, user, password, pool)
}

func newClient(addr, user, password string, pool int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr: addr, Username: user, Password: password,
		PoolSize: pool, MaxRetries: -1, DisableIdentity: true,
	})
}

// scriptAttempts returns the entries of the ACL log made by the leakybucket
// user since setup: each is a command it was refused.
func (s *server) refusedCommands(ctx context.Context) ([]string, error) {
	admin := s.client("", "", 1)
	defer admin.Close()
	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Username == lbUser {
			out = append(out, fmt.Sprintf("%s %s (%s, %d times)", e.Reason, e.Object, e.Context, e.Count))
		}
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
