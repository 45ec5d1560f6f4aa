// Package redisserver runs a redis-server process of a test's own, for
// the outage tests of the middlewares: started on a free loopback port,
// denied scripting as make test's servers are, killed (SIGKILL, as a
// crash would) and started again on the same port. Only tests import it.
package redisserver

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Server is a redis-server process on a loopback port.
type Server struct {
	Addr string // host:port
	bin  string
	args []string
	cmd  *exec.Cmd
}

// Start starts a redis-server on a free port, without persistence, its
// default user denied scripting, and kills it when the test ends. It
// skips the test where none is installed, and fails it under CI, which
// must run every test.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed: CI must run the outage tests (use make test)")
		}
		t.Skip("redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting"}}
	s.Restart(t)
	t.Cleanup(s.Kill)
	return s
}

// Restart starts the server (again, after Kill) on its port and waits
// until it answers.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command(s.bin, s.args...)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	for deadline := time.Now().Add(10 * time.Second); rdb.Ping(context.Background()).Err() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 10s", s.Addr)
		}
	}
}

// Kill ends the server at once (SIGKILL), as a crash would, and waits
// for it to exit.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}
