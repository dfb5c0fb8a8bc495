package httpx

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns the client address of r: the peer (RemoteAddr) unless
// the peer is in trusted, in which case it walks the forwarding header
// (header is "X-Forwarded-For" or "Forwarded") from the right and returns
// the first address that is not a trusted proxy. An unparsable entry ends
// the walk at the last trusted hop: what lies left of it cannot be
// believed. IPv4-mapped IPv6 addresses are unmapped. ok is false when
// RemoteAddr itself is not an IP address (a Unix socket, say).
func ClientIP(r *http.Request, trusted []netip.Prefix, header string) (ip netip.Addr, ok bool) {
	peer, ok := parseRemote(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if len(trusted) == 0 || !isTrusted(peer, trusted) {
		return peer, true
	}
	values := r.Header.Values(header)
	cur := peer
	forwarded := strings.EqualFold(header, "Forwarded")
	// Walk the header lines right to left, then each line's entries.
	for i := len(values) - 1; i >= 0; i-- {
		line := values[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			var a netip.Addr
			var good bool
			if forwarded {
				a, good = parseForwardedFor(entry)
			} else {
				a, good = parseHost(strings.TrimSpace(entry))
			}
			if !good {
				return cur, true
			}
			cur = a
			if !isTrusted(a, trusted) {
				return a, true
			}
		}
	}
	return cur, true
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func parseRemote(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return parseHost(s)
}

// parseHost parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]" or "[::1]:80".
func parseHost(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// parseForwardedFor extracts the for= node of one RFC 7239 forwarded-element
// ("for=192.0.2.60;proto=http;by=203.0.113.43", `for="[2001:db8::1]:4711"`).
// Obfuscated identifiers and "unknown" are not addresses.
func parseForwardedFor(elem string) (netip.Addr, bool) {
	for _, pair := range strings.Split(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return parseHost(v)
	}
	return netip.Addr{}, false
}
