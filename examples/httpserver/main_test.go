package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The server, started in-process on a free port on the embedded miniredis,
// admits 5 requests of an API key, then answers 429 with Retry-After and
// the RateLimit fields; another key, and a client without one, keep their
// own counts.
func TestServe(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	url, stdout := start(t, "-addr", "127.0.0.1:0", "-legacy-headers")
	if !strings.Contains(stdout.String(), "listening on "+url) || !strings.Contains(stdout.String(), "curl") {
		t.Errorf("it did not say where it listens and what to try:\n%s", stdout)
	}
	for i := 1; i <= 6; i++ {
		resp := call(t, url, "key-1")
		want := map[bool]int{true: http.StatusOK, false: http.StatusTooManyRequests}[i <= 5]
		if resp.StatusCode != want {
			t.Fatalf("request %d: %s, want %d", i, resp.Status, want)
		}
		h := resp.Header
		if h.Get("RateLimit-Policy") != `"per-client-10s";q=5;w=10` || !strings.HasPrefix(h.Get("RateLimit"), `"per-client-10s";r=`) || h.Get("RateLimit-Limit") != "5" {
			t.Errorf("request %d: RateLimit-Policy %q, RateLimit %q, RateLimit-Limit %q", i, h.Get("RateLimit-Policy"), h.Get("RateLimit"), h.Get("RateLimit-Limit"))
		}
		if i == 6 && (h.Get("Retry-After") == "" || h.Get("Retry-After") == "0") {
			t.Errorf("the denial has Retry-After %q", h.Get("Retry-After"))
		}
	}
	for _, key := range []string{"key-2", ""} {
		if resp := call(t, url, key); resp.StatusCode != http.StatusOK {
			t.Errorf("key %q after key-1 was denied: %s", key, resp.Status)
		}
	}
}

// -h documents every flag and REDIS_URL.
func TestUsage(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"-h"}, io.Discard, &stderr, nil)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"REDIS_URL", "-addr", "-strategy", "-trusted-proxies", "-fail-open", "-legacy-headers", "127.0.0.1:8080"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("-h does not mention %s:\n%s", want, stderr.String())
		}
	}
	if err := run(context.Background(), []string{"-trusted-proxies", "nonsense"}, io.Discard, io.Discard, nil); err == nil {
		t.Error("a bad -trusted-proxies was accepted")
	}
}

// start runs the server with args until the test ends, and returns its
// URL and what it printed.
func start(t *testing.T, args ...string) (string, *bytes.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var stdout bytes.Buffer
	go func() { done <- run(ctx, args, &stdout, io.Discard, ready) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	select {
	case url := <-ready:
		return url, &stdout
	case err := <-done:
		t.Fatalf("run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not start in 10s")
	}
	return "", nil
}

// call sends GET / with key as X-API-Key (none if empty).
func call(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}
