package httpx

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/spillway-go/spillway/internal/clientip"
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
	parse := clientip.ParseHost
	if strings.EqualFold(header, "Forwarded") {
		parse = parseForwardedFor
	}
	return clientip.Walk(peer, r.Header.Values(header), trusted, parse), true
}

func parseRemote(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	return clientip.ParseHost(s)
}

// parseForwardedFor extracts the for= node of one RFC 7239 forwarded-element
// ("for=192.0.2.60;proto=http;by=203.0.113.43", `for="[2001:db8::1]:4711"`).
// Obfuscated identifiers and "unknown" are not addresses.
func parseForwardedFor(elem string) (netip.Addr, bool) {
	for elem != "" {
		var pair string
		pair, elem, _ = strings.Cut(elem, ";") // no slice of pairs per request
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "for") {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		return clientip.ParseHost(v)
	}
	return netip.Addr{}, false
}
