package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/leakybucket/leakybucket"
)

var proxies = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}

func request(remote string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// The client is the right-most address that is not a trusted proxy, read
// only when the peer itself is trusted: a header from anyone else is
// ignored, and so is whatever a client wrote left of the first proxy.
func TestXForwardedFor(t *testing.T) {
	key := XForwardedFor(proxies...)
	xff := "X-Forwarded-For"
	for _, c := range []struct {
		name   string
		remote string
		header []string
		want   string
	}{
		{"no header", "203.0.113.9:4711", nil, "ip:203.0.113.9"},
		{"spoofed by an untrusted peer", "203.0.113.9:4711", []string{xff, "198.51.100.1"}, "ip:203.0.113.9"},
		{"one proxy", "10.0.0.1:80", []string{xff, "203.0.113.9"}, "ip:203.0.113.9"},
		{"client's own entries left of it", "10.0.0.1:80", []string{xff, "198.51.100.1, 192.0.2.7, 203.0.113.9"}, "ip:203.0.113.9"},
		{"two proxies", "10.0.0.1:80", []string{xff, "198.51.100.1, 203.0.113.9, 10.0.0.2"}, "ip:203.0.113.9"},
		{"several lines", "10.0.0.1:80", []string{xff, "198.51.100.1", xff, "203.0.113.9,10.0.0.2"}, "ip:203.0.113.9"},
		{"every hop trusted", "10.0.0.1:80", []string{xff, "10.0.0.3, 10.0.0.2"}, "ip:10.0.0.3"},
		{"no header from a proxy", "10.0.0.1:80", nil, "ip:10.0.0.1"},
		{"garbage stops the walk", "10.0.0.1:80", []string{xff, "203.0.113.9, unknown, 10.0.0.2"}, "ip:10.0.0.2"},
		{"empty entry stops the walk", "10.0.0.1:80", []string{xff, "203.0.113.9,,"}, "ip:10.0.0.1"},
		{"port", "10.0.0.1:80", []string{xff, "203.0.113.9:5555"}, "ip:203.0.113.9"},
		{"IPv6 with port", "[fd00::1]:80", []string{xff, "[2001:db8::7]:5555"}, "ip:2001:db8::7"},
		{"IPv6 bare", "[fd00::1]:80", []string{xff, "2001:db8::7"}, "ip:2001:db8::7"},
		{"IPv6 in brackets", "[fd00::1]:80", []string{xff, "[2001:db8::7]"}, "ip:2001:db8::7"},
		{"IPv4-mapped", "[::ffff:10.0.0.1]:80", []string{xff, "::ffff:203.0.113.9"}, "ip:203.0.113.9"},
	} {
		if got, err := key(request(c.remote, c.header...)); err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
	if _, err := key(request("@")); !errors.Is(err, ErrNoKey) {
		t.Errorf("RemoteAddr without an IP: %v, want ErrNoKey", err)
	}
}

func TestForwarded(t *testing.T) {
	key := Forwarded(proxies...)
	for _, c := range []struct {
		name   string
		remote string
		header []string
		want   string
	}{
		{"spoofed by an untrusted peer", "203.0.113.9:1", []string{"Forwarded", "for=198.51.100.1"}, "ip:203.0.113.9"},
		{"one proxy", "10.0.0.1:1", []string{"Forwarded", "for=203.0.113.9;proto=https;by=10.0.0.1"}, "ip:203.0.113.9"},
		{"two, quoted IPv6", "10.0.0.1:1", []string{"Forwarded", `for=198.51.100.1, For="[2001:db8:cafe::17]:4711", for=10.0.0.2`}, "ip:2001:db8:cafe::17"},
		{"quoted comma", "10.0.0.1:1", []string{"Forwarded", `for="198.51.100.1,x", for=203.0.113.9`}, "ip:203.0.113.9"},
		{"several lines", "10.0.0.1:1", []string{"Forwarded", "for=198.51.100.1", "Forwarded", "for=203.0.113.9"}, "ip:203.0.113.9"},
		{"obfuscated stops the walk", "10.0.0.1:1", []string{"Forwarded", "for=203.0.113.9, for=_hidden, for=10.0.0.2"}, "ip:10.0.0.2"},
		{"no for stops the walk", "10.0.0.1:1", []string{"Forwarded", "for=203.0.113.9, proto=http"}, "ip:10.0.0.1"},
		{"X-Forwarded-For ignored", "10.0.0.1:1", []string{"X-Forwarded-For", "203.0.113.9"}, "ip:10.0.0.1"},
	} {
		if got, err := key(request(c.remote, c.header...)); err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

// A header keys by its name and a hash of its value, never the value
// itself; without it the fallback keys, or the request has no key.
func TestHeader(t *testing.T) {
	key := Header("x-api-key", RemoteIP)
	a, err := key(request("203.0.113.9:1", "X-API-Key", "secret-a"))
	if err != nil || !strings.HasPrefix(a, "X-Api-Key:") || strings.Contains(a, "secret") {
		t.Errorf("with the header: %q, %v", a, err)
	}
	b, _ := key(request("203.0.113.9:1", "X-API-Key", "secret-b"))
	again, _ := key(request("198.51.100.1:1", "X-API-Key", "secret-a"))
	if a == b || a != again {
		t.Errorf("keys %q, %q, %q: want one per value, whatever the peer", a, b, again)
	}
	if got, err := key(request("203.0.113.9:1")); err != nil || got != "ip:203.0.113.9" {
		t.Errorf("without the header: %q, %v; want the fallback's", got, err)
	}
	if _, err := Header("X-API-Key", nil)(request("203.0.113.9:1")); !errors.Is(err, ErrNoKey) {
		t.Errorf("without the header nor a fallback: %v, want ErrNoKey", err)
	}
}

// Through the middleware, spoofed headers from an untrusted peer change
// nothing: every request counts against the peer.
func TestSpoofedHeaderIsCountedAgainstThePeer(t *testing.T) {
	rdb, _ := miniClient(t)
	h := handler(t, bucket(t, rdb, leakybucket.PerClient(leakybucket.PerMinute(2))), WithKey(XForwardedFor(proxies...)))
	for i, spoof := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		w := get(h, "203.0.113.9:1", "X-Forwarded-For", spoof)
		if want := map[bool]int{true: 200, false: 429}[i < 2]; w.Code != want {
			t.Errorf("request %d, spoofing %s: %d, want %d", i, spoof, w.Code, want)
		}
	}
}
