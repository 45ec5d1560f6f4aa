package httplimit

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// RemoteIP is a KeyFunc: the IP address of the request's peer, from
// RemoteAddr, as "ip:203.0.113.9" or "ip:2001:db8::1" (an IPv4-mapped IPv6
// address is written as IPv4, a zone is dropped). Behind a proxy or load
// balancer every request has the proxy's address: use XForwardedFor or
// Forwarded there. It is the default of New.
func RemoteIP(r *http.Request) (string, error) {
	addr, ok := remoteAddr(r)
	if !ok {
		return "", ErrNoKey
	}
	return ipKey(addr), nil
}

// XForwardedFor returns a KeyFunc for servers behind proxies that append
// the address of their peer to X-Forwarded-For. It trusts the header only
// from the proxies within trusted: when the request's peer is one of them,
// it reads the addresses of every X-Forwarded-For line from the right and
// keys the request by the first one that is not a trusted proxy: the
// client as the outermost trusted proxy saw it. Addresses further left
// were written by the client or by proxies that are not trusted, and are
// ignored, so a client cannot choose its key by sending the header. From
// a peer that is not trusted, the header is ignored and the key is the
// peer's address (RemoteIP). If every address is trusted, the left-most
// is the key; an entry that is not an IP address (with or without port)
// stops the walk, and the last trusted address before it is the key.
func XForwardedFor(trusted ...netip.Prefix) KeyFunc {
	return proxied(trusted, func(h http.Header) []string {
		var hops []string
		for _, line := range h.Values("X-Forwarded-For") {
			for hop := range strings.SplitSeq(line, ",") {
				hops = append(hops, strings.TrimSpace(hop))
			}
		}
		return hops
	})
}

// Forwarded returns a KeyFunc as XForwardedFor, that reads the "for"
// parameters of the Forwarded header (RFC 7239) instead: for=192.0.2.60,
// for="[2001:db8:cafe::17]:4711". An element without a "for" that is an
// IP address ("unknown", an obfuscated "_hidden" node) stops the walk as
// a malformed entry does.
func Forwarded(trusted ...netip.Prefix) KeyFunc {
	return proxied(trusted, func(h http.Header) []string {
		var hops []string
		for _, line := range h.Values("Forwarded") {
			for _, element := range splitQuoted(line, ',') {
				hops = append(hops, forParam(element))
			}
		}
		return hops
	})
}

// proxied returns a KeyFunc that walks the hops that hops reads from the
// headers, right to left, past the trusted proxies.
func proxied(trusted []netip.Prefix, hops func(http.Header) []string) KeyFunc {
	trusted = slices.Clone(trusted)
	isTrusted := func(a netip.Addr) bool {
		return slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	return func(r *http.Request) (string, error) {
		client, ok := remoteAddr(r)
		if !ok {
			return "", ErrNoKey
		}
		chain := hops(r.Header)
		for i := len(chain) - 1; i >= 0 && isTrusted(client); i-- {
			hop, ok := parseHop(chain[i])
			if !ok {
				break
			}
			client = hop
		}
		return ipKey(client), nil
	}
}

// Header returns a KeyFunc that keys a request by the value of its header
// name, such as an API key, or, when the header is absent or empty, by
// fallback (nil: refuse the request with ErrNoKey). The key is the
// header's name and a hash of its value (SHA-256, 128 bits), so that
// secrets do not land in Redis key names, and a value never collides
// with another KeyFunc's key.
//
// A client can send any value: unless the value is checked before the
// limiter (an authentication middleware in front of it), inventing keys
// escapes the fallback's limit. Key by a header only when it is
// authenticated, or when a per-resource rule bounds everyone together.
func Header(name string, fallback KeyFunc) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header.Get(name); v != "" {
			sum := sha256.Sum256([]byte(v))
			return name + ":" + base64.RawURLEncoding.EncodeToString(sum[:16]), nil
		}
		if fallback == nil {
			return "", ErrNoKey
		}
		return fallback(r)
	}
}

// remoteAddr parses the IP address of r's peer.
func remoteAddr(r *http.Request) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if a, err := netip.ParseAddr(r.RemoteAddr); err == nil {
		return a.Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

// parseHop parses an address of a proxy chain: an IP address, with or
// without a port, IPv6 in brackets with a port.
func parseHop(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func ipKey(a netip.Addr) string { return "ip:" + a.String() }

// forParam returns the value of the "for" parameter of a Forwarded
// element, unquoted, or "" if it has none.
func forParam(element string) string {
	for _, pair := range splitQuoted(element, ';') {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
			return unquote(strings.TrimSpace(v))
		}
	}
	return ""
}

// splitQuoted splits s at sep outside quoted strings.
func splitQuoted(s string, sep byte) []string {
	var parts []string
	quoted, escaped, start := false, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// unquote returns a quoted-string's content, its escapes undone; a token
// as it is.
func unquote(v string) string {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return v
	}
	var b strings.Builder
	escaped := false
	for _, c := range []byte(v[1 : len(v)-1]) {
		if c == '\\' && !escaped {
			escaped = true
			continue
		}
		escaped = false
		b.WriteByte(c)
	}
	return b.String()
}

// groupIPv6 keys an "ip:" key of an IPv6 address by its leading bits, as
// "ip:2001:db8:1:2::/64"; other keys, IPv4 ones included, are kept.
func groupIPv6(key string, bits int) string {
	s, ok := strings.CutPrefix(key, "ip:")
	if !ok || bits == 128 {
		return key
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() || a.Is4In6() {
		return key
	}
	p, err := a.WithZone("").Prefix(bits)
	if err != nil {
		return key
	}
	return "ip:" + p.String()
}
