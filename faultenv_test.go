//go:build linux

// Linux only: the servers are started with Pdeathsig, so that a test binary
// killed by -timeout (which runs no Cleanup) leaves no redis-server behind.

package leakybucket

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The fault harness: redis-server processes owned by the test, so that it
// can pause (SIGSTOP), kill and restart them; a TCP proxy that adds latency
// and cuts connections mid-transaction; a load generator that classifies
// every call's outcome; and a goroutine-leak check. fault_test.go uses it.

// freePort returns a loopback port that was free a moment ago: the kernel
// picks it for a listener that is closed at once. Another process may take
// it in between, so startRedis tries again with a new port if it must.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// redisProc is a redis-server child process on a loopback port, without
// persistence, whose default user is denied scripting.
type redisProc struct {
	t     testing.TB
	bin   string
	dir   string
	port  int
	extra []string // configuration beside the defaults of args

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited and been waited for
}

// redisServerBin finds redis-server, or skips the test (fails it under CI,
// which must run every test, as realClient does).
func redisServerBin(t testing.TB) string {
	t.Helper()
	return binOrSkip(t, "redis-server")
}

// binOrSkip finds the program name, or skips the test: fails it under CI
// or under scripts/test.sh (LEAKYBUCKET_REDIS_ADDR set), which install
// what the tests need and must run every one.
func binOrSkip(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err == nil {
		return bin
	}
	if os.Getenv("CI") != "" || os.Getenv("LEAKYBUCKET_REDIS_ADDR") != "" {
		t.Fatalf("%s is not installed: CI and make test must run the fault tests (%v)", name, err)
	}
	t.Skipf("%s is not installed: %v", name, err)
	return ""
}

// startRedis starts a dedicated redis-server on a free loopback port and
// waits until it answers PING. It is killed when the test ends.
func startRedis(t testing.TB) *redisProc {
	t.Helper()
	return startRedisWith(t)
}

// startRedisWith is startRedis, with configuration args beside the
// defaults (a replica's --replicaof, a cluster node's settings).
func startRedisWith(t testing.TB, extra ...string) *redisProc {
	t.Helper()
	p := &redisProc{t: t, bin: redisServerBin(t), dir: t.TempDir(), extra: extra}
	t.Cleanup(p.Kill)
	var err error
	for range 3 {
		p.port = freePort(t)
		if err = p.spawn(); err == nil {
			return p
		}
	}
	t.Fatalf("redis-server would not start: %v", err)
	return nil
}

// Addr is the server's host:port.
func (p *redisProc) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// Pid is the current process's id (it changes with Restart).
func (p *redisProc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

func (p *redisProc) args() []string {
	return append([]string{
		"--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log"),
		"--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting",
	}, p.extra...)
}

// spawn starts the process on p.port and waits until it is the one that
// answers there.
func (p *redisProc) spawn() error {
	cmd := exec.Command(p.bin, p.args()...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	if err := p.waitReady(cmd.Process.Pid, exited, 10*time.Second); err != nil {
		p.Kill()
		return fmt.Errorf("%w; log:\n%s", err, p.logTail())
	}
	return nil
}

// waitReady polls until the server on the port answers PING and reports
// pid as its own (not another server that got the port first).
func (p *redisProc) waitReady(pid int, exited <-chan struct{}, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited", p.port)
		default:
		}
		info, err := rawCommand(p.Addr(), "INFO server", 200*time.Millisecond)
		if err == nil && strings.Contains(info, "process_id:"+strconv.Itoa(pid)+"\r\n") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server pid %d on port %d not ready after %v: %v", pid, p.port, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logTail returns the end of the server's log, for failure messages.
func (p *redisProc) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

func (p *redisProc) signal(sig syscall.Signal) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Errorf("redis-server pid %d: %v: %v", p.cmd.Process.Pid, sig, err)
	}
}

// Stop pauses the server (SIGSTOP): connections stay open, and the kernel
// still accepts new ones, but nothing is answered.
func (p *redisProc) Stop() { p.signal(syscall.SIGSTOP) }

// Cont resumes a paused server (SIGCONT).
func (p *redisProc) Cont() { p.signal(syscall.SIGCONT) }

// Kill kills the server (SIGKILL, even when paused) and waits until it has
// exited. It does nothing if the server is not running.
func (p *redisProc) Kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		p.t.Errorf("redis-server pid %d still running 5s after SIGKILL", cmd.Process.Pid)
	}
}

// Restart kills the server if it runs, and starts a new one, empty, on the
// same port.
func (p *redisProc) Restart() {
	p.t.Helper()
	p.Kill()
	if err := p.spawn(); err != nil {
		p.t.Fatalf("restart on port %d: %v", p.port, err)
	}
}

// rawCommand sends one inline command on a fresh connection and returns the
// reply's payload: a simple string, or a bulk string. It needs no client
// pool, so it leaves no goroutine behind.
func rawCommand(addr, command string, timeout time.Duration) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, command+"\r\n"); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case strings.HasPrefix(line, "+"):
		return line[1:], nil
	case strings.HasPrefix(line, "$"):
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		_, err = io.ReadFull(r, buf)
		return string(buf[:n]), err
	}
	return "", fmt.Errorf("reply %q", line)
}

// newFaultClient returns a client of addr, closed when the test ends. With
// ctxTimeout, the context's deadline bounds its network I/O, as the README
// recommends; without, only go-redis's read and write timeouts (3 s) do.
// Maintenance notifications are off: their endpoint detection is not under
// test and would add goroutines to the leak check.
func newFaultClient(t testing.TB, addr string, ctxTimeout bool) *redis.Client {
	t.Helper()
	return faultClient(t, redis.Options{Addr: addr, ContextTimeoutEnabled: ctxTimeout})
}

// faultClient returns a client with opt, maintenance notifications off,
// closed when the test ends.
func faultClient(t testing.TB, opt redis.Options) *redis.Client {
	t.Helper()
	opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	rdb := redis.NewClient(&opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// proxy is a TCP proxy on a free loopback port that forwards to a target,
// with faults that can be changed while it runs: latency added to each
// direction, cutting every live connection at once, and cutting each
// connection after a random number of bytes.
type proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	latency   atomic.Int64 // nanoseconds added to each direction
	dropAfter atomic.Int64 // if > 0, cut each new connection after 1..dropAfter bytes
	cuts      atomic.Int64 // connections cut by DropAll or their byte budget

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	budget         atomic.Int64 // bytes left, both directions together, before the cut
	dead           chan struct{}
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.dead)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// spend takes len(data) bytes from the link's budget, and returns the part
// of data that fits and whether the budget ran out (then the link must be
// cut after writing that part).
func (l *link) spend(data []byte) ([]byte, bool) {
	left := l.budget.Add(-int64(len(data)))
	if left >= 0 {
		return data, false
	}
	return data[:max(0, int64(len(data))+left)], true
}

// startProxy starts a proxy to target; it stops when the test ends.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every chunk of bytes by d, in each direction, without
// reordering them.
func (p *proxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SetDropAfter makes each connection opened from now on die after a random
// number of bytes (both directions together) between 1 and maxBytes, cut
// in the middle of a command or a reply; 0 turns it off.
func (p *proxy) SetDropAfter(maxBytes int) { p.dropAfter.Store(int64(maxBytes)) }

// DropAll cuts every live connection now, and returns how many it cut.
func (p *proxy) DropAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		l.close()
		delete(p.links, l)
		n++
	}
	p.cuts.Add(int64(n))
	return n
}

// Cuts is how many connections DropAll and the byte budgets have cut.
func (p *proxy) Cuts() int64 { return p.cuts.Load() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.open(c)
	}
}

// open connects an accepted connection to the target; if the target
// refuses, the client sees its connection closed.
func (p *proxy) open(c net.Conn) {
	s, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	l := &link{client: c, server: s, dead: make(chan struct{})}
	l.budget.Store(math.MaxInt64)
	if n := p.dropAfter.Load(); n > 0 {
		l.budget.Store(1 + rand.Int64N(n))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.wg.Add(2)
	go p.pipe(l, c, s)
	go p.pipe(l, s, c)
}

// chunk is bytes read from one side, to be written to the other at due.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies one direction of l, each chunk delayed by the latency at
// the time it was read, and cuts l when either side ends.
func (p *proxy) pipe(l *link, from, to net.Conn) {
	defer p.wg.Done()
	defer p.forget(l)
	chunks := make(chan chunk, 16) // bounds the bytes in flight per direction
	delivered := make(chan struct{})
	go func() {
		defer close(delivered)
		p.deliver(l, to, chunks)
	}()
	p.receive(from, chunks)
	<-delivered
}

func (p *proxy) forget(l *link) {
	l.close()
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *proxy) receive(from net.Conn, chunks chan<- chunk) {
	defer close(chunks)
	for {
		buf := make([]byte, 16<<10)
		n, err := from.Read(buf)
		if n > 0 {
			chunks <- chunk{data: buf[:n], due: time.Now().Add(time.Duration(p.latency.Load()))}
		}
		if err != nil {
			return
		}
	}
}

// deliver writes the chunks when due, and once the link broke drains them
// so that receive never blocks.
func (p *proxy) deliver(l *link, to net.Conn, chunks <-chan chunk) {
	wait := time.NewTimer(0)
	defer wait.Stop()
	for c := range chunks {
		wait.Reset(time.Until(c.due))
		select {
		case <-l.dead:
			continue
		case <-wait.C:
		}
		data, cut := l.spend(c.data)
		if _, err := to.Write(data); err != nil || cut {
			if cut {
				p.cuts.Add(1)
			}
			l.close()
		}
	}
}

// close stops accepting, cuts every connection and waits (bounded) for the
// proxy's goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.DropAll()
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.t.Errorf("proxy to %s: goroutines still running 5s after close", p.target)
	}
}

// Error classes of callStats, in the order they are tested: an error that
// matches several (ErrLockNotObtained is joined with the context's error)
// counts under the first.
const (
	classLockNotObtained = "lock not obtained"
	classUnavailable     = "unavailable"
	classDeadline        = "context deadline"
	classOther           = "other"
)

func errClassOf(err error) string {
	switch {
	case errors.Is(err, ErrLockNotObtained):
		return classLockNotObtained
	case errors.Is(err, ErrUnavailable):
		return classUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return classDeadline
	}
	return classOther
}

// rootCause names the network cause in err's chain, or "" if there is none:
// what an ErrUnavailable must keep.
//
// context.DeadlineExceeded is a net.Error whose Timeout is true, so an I/O
// timeout is recognised by os.ErrDeadlineExceeded (what a socket deadline
// returns) or a *net.OpError, never by the net.Error interface.
func rootCause(err error) string {
	var opErr *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "ECONNREFUSED"
	case errors.Is(err, syscall.ECONNRESET):
		return "ECONNRESET"
	case errors.Is(err, syscall.EPIPE):
		return "EPIPE"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "EOF"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.As(err, &opErr) && opErr.Timeout():
		return "i/o timeout"
	case errors.Is(err, net.ErrClosed):
		return "use of closed connection"
	}
	return ""
}

// callStats tallies the outcomes of calls. Safe for concurrent use.
type callStats struct {
	mu         sync.Mutex
	calls      int
	admitted   int
	denied     int
	errs       map[string]int    // by class
	examples   map[string]string // by class: the first message
	maxTook    time.Duration     // the slowest call
	maxOverrun time.Duration     // the longest return after a call's deadline
	elapsed    time.Duration     // wall time of the run
	schedLag   time.Duration     // the latest a 1 ms sleep woke up during the run
}

// allowedOverrun is how late after its deadline a call may return: slack,
// plus however late the scheduler woke a sleeping goroutine meanwhile, which
// the library cannot help (on a loaded 2-core machine, tens of ms).
func (s *callStats) allowedOverrun(slack time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slack + s.schedLag
}

// overrunBeyond reports whether a call returned later after its deadline
// than allowedOverrun(slack).
func (s *callStats) overrunBeyond(slack time.Duration) bool {
	allowed := s.allowedOverrun(slack)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxOverrun > allowed
}

// probeScheduler measures, until stop closes, how late 1 ms sleeps wake.
func (s *callStats) probeScheduler(stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	watchScheduler(stop, func(late time.Duration) {
		s.mu.Lock()
		s.schedLag = max(s.schedLag, late)
		s.mu.Unlock()
	})
}

func newCallStats() *callStats {
	return &callStats{errs: map[string]int{}, examples: map[string]string{}}
}

func (s *callStats) add(o observed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.maxTook = max(s.maxTook, o.took)
	s.maxOverrun = max(s.maxOverrun, o.overrun)
	switch {
	case o.err != nil:
		class := errClassOf(o.err)
		s.errs[class]++
		if _, ok := s.examples[class]; !ok {
			s.examples[class] = o.err.Error()
		}
	case o.res.Allowed:
		s.admitted++
	default:
		s.denied++
	}
}

// failed returns how many calls returned an error.
func (s *callStats) failed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.errs {
		n += c
	}
	return n
}

// errorsOf returns how many calls failed with an error of class.
func (s *callStats) errorsOf(class string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs[class]
}

// rate is admissions per second of wall time.
func (s *callStats) rate() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.admitted) / s.elapsed.Seconds()
}

func (s *callStats) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d calls in %v: %d admitted, %d denied", s.calls, s.elapsed.Round(time.Millisecond), s.admitted, s.denied)
	for _, class := range slices.Sorted(mapKeys(s.errs)) {
		fmt.Fprintf(&b, ", %d %s (e.g. %q)", s.errs[class], class, s.examples[class])
	}
	fmt.Fprintf(&b, "; slowest %v, worst overrun of a deadline %v (scheduler lag up to %v)",
		s.maxTook.Round(time.Millisecond), s.maxOverrun.Round(time.Millisecond), s.schedLag.Round(time.Millisecond))
	return b.String()
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// load describes goroutines calling Allow in a loop.
type load struct {
	buckets    []*Bucket // goroutine g calls buckets[g%len(buckets)]
	resource   string
	client     func(g int) string               // nil: every goroutine is client "c"
	goroutines int                              // how many
	timeout    func(r *rand.Rand) time.Duration // each call's deadline
	calls      int                              // per goroutine; 0: until stopped
	observe    func(g int, o observed)          // optional, called after each call
	errorPause time.Duration                    // wait after a failed call, so that instant failures do not spin
}

// observed is one call, as load.observe sees it.
type observed struct {
	start   time.Time
	took    time.Duration
	timeout time.Duration
	overrun time.Duration // how late after its deadline the call returned: see overrunAt
	res     Result
	err     error
}

// overrunAt is how long after its deadline a call that returned at
// returned did, counted from when the runtime delivered the context's end
// (endedNs, 0 if it never did) if that came later than the deadline: a
// loaded scheduler delays that delivery whatever the library does, and the
// library can only answer once it has it.
func (o observed) overrunAt(returned time.Time, endedNs int64) time.Duration {
	from := o.start.Add(o.timeout)
	if endedNs > 0 {
		if ended := time.Unix(0, endedNs); ended.After(from) {
			from = ended
		}
	}
	return max(returned.Sub(from), 0)
}

// fixed is a load.timeout that is always d.
func fixed(d time.Duration) func(*rand.Rand) time.Duration {
	return func(*rand.Rand) time.Duration { return d }
}

// uniform is a load.timeout drawn uniformly from [lo, hi].
func uniform(lo, hi time.Duration) func(*rand.Rand) time.Duration {
	return func(r *rand.Rand) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo)+1)) }
}

// loadRun is a running load.
type loadRun struct {
	stats   *callStats
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	started time.Time
	limit   *time.Timer // halts the load after loadLimit
}

// loadLimit bounds any load, whatever its test asks, so that a hung test
// still ends.
const loadLimit = 30 * time.Second

// startLoad starts l's goroutines and returns at once.
func startLoad(l load) *loadRun {
	r := &loadRun{stats: newCallStats(), stop: make(chan struct{}), started: time.Now()}
	r.limit = time.AfterFunc(loadLimit, r.halt)
	r.wg.Add(1)
	go r.stats.probeScheduler(r.stop, &r.wg)
	var workers sync.WaitGroup
	for g := range l.goroutines {
		r.wg.Add(1)
		workers.Add(1)
		go func() {
			defer workers.Done()
			r.worker(l, g)
		}()
	}
	// A load of a bounded number of calls ends when they are made: stop
	// the probe with it.
	go func() {
		workers.Wait()
		r.halt()
	}()
	return r
}

// halt asks the goroutines to start no new call; it does not wait.
func (r *loadRun) halt() { r.once.Do(func() { close(r.stop) }) }

// wait waits, at most within, for every goroutine to return; it reports
// whether they all did.
func (r *loadRun) wait(within time.Duration) bool {
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	finished := true
	select {
	case <-done:
		r.limit.Stop()
	case <-time.After(within):
		finished = false
	}
	r.stats.mu.Lock()
	r.stats.elapsed = time.Since(r.started)
	r.stats.mu.Unlock()
	return finished
}

// Stop halts the load and waits for it (failing t if it hangs past
// within), and returns its tally.
func (r *loadRun) Stop(t testing.TB, within time.Duration) *callStats {
	t.Helper()
	r.halt()
	if !r.wait(within) {
		t.Errorf("load: calls still running %v after it was stopped", within)
	}
	return r.stats
}

// runLoad runs l for d (or until its calls are done, if sooner) and
// returns its tally.
func runLoad(t testing.TB, l load, d time.Duration) *callStats {
	t.Helper()
	r := startLoad(l)
	finished := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(finished)
	}()
	select {
	case <-time.After(d):
	case <-finished:
	}
	return r.Stop(t, 10*time.Second)
}

func (r *loadRun) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
	}
	return false
}

func (r *loadRun) worker(l load, g int) {
	defer r.wg.Done()
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	b := l.buckets[g%len(l.buckets)]
	client := "c"
	if l.client != nil {
		client = l.client(g)
	}
	for i := 0; (l.calls == 0 || i < l.calls) && !r.stopped(); i++ {
		o := observed{timeout: l.timeout(rng), start: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		var ended atomic.Int64 // when the runtime delivered the context's end
		stop := context.AfterFunc(ctx, func() { ended.Store(time.Now().UnixNano()) })
		o.res, o.err = b.Allow(ctx, l.resource, client)
		returned := time.Now()
		o.took = returned.Sub(o.start)
		stop()
		cancel()
		o.overrun = o.overrunAt(returned, ended.Load())
		r.stats.add(o)
		if l.observe != nil {
			l.observe(g, o)
		}
		if o.err != nil && l.errorPause > 0 {
			time.Sleep(l.errorPause)
		}
	}
}

// timeToAdmit calls Allow in a loop, each call bounded by perCall, until
// one is admitted, and returns how long after since that was; ok is false
// if none was within the bound, and last is the last call's error.
func timeToAdmit(b *Bucket, resource, client string, since time.Time, perCall, bound time.Duration) (took time.Duration, ok bool, last error) {
	for time.Since(since) < bound {
		ctx, cancel := context.WithTimeout(context.Background(), perCall)
		res, err := b.Allow(ctx, resource, client)
		cancel()
		if err == nil && res.Allowed {
			return time.Since(since), true, nil
		}
		last = err
		if err != nil && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond) // a fast failure: do not spin
		}
	}
	return time.Since(since), false, last
}

// checkGoroutines waits, at most within, until no more than slack
// goroutines run beyond baseline (runtime.NumGoroutine before the test
// made its clients), and otherwise fails t with the extra goroutines
// grouped by where they stand.
func checkGoroutines(t testing.TB, baseline, slack int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	n := runtime.NumGoroutine()
	for n > baseline+slack && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > baseline+slack {
		t.Errorf("goroutine leak: %d goroutines %v after the test, baseline %d (+%d allowed); by top frame:\n%s",
			n, within, baseline, slack, goroutineGroups())
	}
}

// goroutineGroups counts the running goroutines by their top frame and
// creator, the largest groups first.
func goroutineGroups() string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	counts := map[string]int{}
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		lines := strings.Split(g, "\n")
		key := ""
		if len(lines) > 1 {
			key = strings.TrimSpace(lines[1])
		}
		for _, line := range lines {
			if strings.HasPrefix(line, "created by ") {
				key += " <- " + strings.TrimPrefix(line, "created by ")
			}
		}
		counts[key]++
	}
	keys := slices.SortedFunc(mapKeys(counts), func(a, b string) int { return counts[b] - counts[a] })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "  %4d %s\n", counts[k], k)
	}
	return b.String()
}

// TestFaultHarness checks the harness itself, so that a fault test's
// failure is the library's: the server denies scripting and can be paused,
// killed and restarted on its port; the proxy delays and cuts; rootCause
// tells a network timeout from a context deadline; and nothing is left
// running.
func TestFaultHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault tests run real servers for seconds")
	}
	baseline := runtime.NumGoroutine()
	srv := startRedis(t)
	direct := faultClient(t, redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	if err := direct.Eval(context.Background(), "return 1", nil).Err(); !redis.IsPermissionError(err) {
		t.Errorf("EVAL = %v, want NOPERM", err)
	}
	checkPause(t, srv, direct)
	checkRestart(t, srv, direct)
	px := startProxy(t, srv.Addr())
	viaProxy := faultClient(t, redis.Options{Addr: px.Addr(), MaxRetries: -1, DialerRetries: 1})
	checkProxy(t, px, viaProxy)
	if got := rootCause(fmt.Errorf("x: %w", context.DeadlineExceeded)); got != "" {
		t.Errorf("rootCause(context.DeadlineExceeded) = %q, want none", got)
	}
	_ = direct.Close()
	_ = viaProxy.Close()
	px.close()
	srv.Kill()
	checkGoroutines(t, baseline, 0, 5*time.Second)
}

func checkPause(t *testing.T, srv *redisProc, rdb *redis.Client) {
	t.Helper()
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err := rdb.Ping(ctx).Err()
	cancel()
	srv.Cont()
	if rootCause(err) != "i/o timeout" {
		t.Errorf("PING of a paused server = %v (cause %q), want an i/o timeout", err, rootCause(err))
	}
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Errorf("PING after SIGCONT: %v", err)
	}
}

func checkRestart(t *testing.T, srv *redisProc, rdb *redis.Client) {
	t.Helper()
	addr, pid := srv.Addr(), srv.Pid()
	srv.Kill()
	if _, err := rawCommand(addr, "PING", time.Second); rootCause(err) != "ECONNREFUSED" {
		t.Errorf("PING of a killed server: %v, want connection refused", err)
	}
	srv.Restart()
	if srv.Addr() != addr || srv.Pid() == pid {
		t.Errorf("restart: %s pid %d, was %s pid %d", srv.Addr(), srv.Pid(), addr, pid)
	}
	// The pooled connection died with the old process: one error, then a
	// new connection.
	_ = rdb.Ping(context.Background()).Err()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Errorf("PING after the restart: %v", err)
	}
}

func checkProxy(t *testing.T, px *proxy, rdb *redis.Client) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the proxy: %v", err)
	}
	px.SetLatency(20 * time.Millisecond)
	start := time.Now()
	err := rdb.Ping(ctx).Err()
	if took := time.Since(start); err != nil || took < 40*time.Millisecond {
		t.Errorf("PING with 20 ms each way: %v after %v, want at least 40 ms", err, took)
	}
	// A PING held in the proxy when DropAll cuts its connection.
	px.SetLatency(50 * time.Millisecond)
	ping := make(chan error, 1)
	go func() { ping <- rdb.Ping(ctx).Err() }()
	time.Sleep(25 * time.Millisecond)
	if n := px.DropAll(); n != 1 {
		t.Errorf("DropAll cut %d connections, want the pool's 1", n)
	}
	if err := <-ping; rootCause(err) == "" {
		t.Errorf("PING cut by DropAll = %v, want a network error", err)
	}
	px.SetLatency(0)
	// New connections die after 5 bytes, during the handshake.
	px.SetDropAfter(5)
	px.DropAll()
	if err := rdb.Ping(ctx).Err(); rootCause(err) == "" {
		t.Errorf("PING on a connection cut after 5 bytes = %v, want a network error", err)
	}
	px.SetDropAfter(0)
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Errorf("PING through the healed proxy: %v", err)
	}
}
