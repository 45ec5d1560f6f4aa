package inflight

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// TestShortWaitFarServer: a wait shorter than a round trip still gets
// the room its attempt took. A middleware waits 20 ms; a server 12 ms
// away each way answers an attempt sent at once after 24 ms. The room
// was there, and the attempt took it: throwing the reply away (as the
// wait ran out) would leave the caller refused and the room taken until
// the take-back, for nothing.
func TestShortWaitFarServer(t *testing.T) {
	far := delayed(t, miniredis.RunT(t).Addr(), 12*time.Millisecond)
	rdb := redis.NewClient(&redis.Options{Addr: far})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, PerResource(2), WithPrefix(uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Held(ctx, "r"); err != nil { // the clock's first sample, and a connection
		t.Fatal(err)
	}
	for i := range 2 {
		start := time.Now()
		le, err := l.AcquireWithin(ctx, "r", "c", 1, 20*time.Millisecond)
		took := time.Since(start)
		if err != nil || le == nil {
			t.Fatalf("acquisition %d: %v, %v after %v: want the room its attempt took", i, le, err, took)
		}
		if took < 20*time.Millisecond {
			t.Fatalf("acquisition %d took %v: the server is not that near", i, took)
		}
	}
	u, err := l.Held(ctx, "r")
	if err != nil || len(u.Holders) != 2 {
		t.Fatalf("held %+v, %v: want the 2 leases", u, err)
	}
}

// delayed starts a proxy to addr that holds every chunk of bytes, each
// way, for d before it passes it on, and returns its address.
func delayed(t *testing.T, addr string, d time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			go slowCopy(out, in, d)
			go slowCopy(in, out, d)
		}
	}()
	return ln.Addr().String()
}

// slowCopy copies from src to dst, each chunk d after it was read (so
// that a reply in many chunks is late by d, not by d for each), and
// closes both once either side ends.
func slowCopy(dst, src net.Conn, d time.Duration) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range chunks {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer close(chunks)
	defer src.Close()
	for {
		buf := make([]byte, 64<<10)
		n, err := src.Read(buf)
		if n > 0 {
			chunks <- chunk{buf[:n], time.Now().Add(d)}
		}
		if err != nil {
			return // io.EOF, or a closed connection
		}
	}
}
