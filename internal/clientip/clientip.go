// Package clientip finds a request's client address behind trusted
// proxies, for httpx and grpcx alike: one implementation of a rule whose
// mistakes let a client choose its own rate-limit key.
package clientip

import (
	"net/netip"
	"strings"
)

// Walk returns the client address given the peer that connected and the
// forwarding header values it sent (in order, each a comma-separated list).
// Unless the peer is trusted the header is ignored and the peer is the
// client. Otherwise the entries are walked from the right and the first
// address that is not a trusted proxy is returned (the left-most if all
// are). An entry that parse rejects ends the walk at the last trusted hop:
// what lies left of it cannot be believed.
func Walk(peer netip.Addr, values []string, trusted []netip.Prefix, parse func(entry string) (netip.Addr, bool)) netip.Addr {
	if len(trusted) == 0 || !IsTrusted(peer, trusted) {
		return peer
	}
	cur := peer
	for i := len(values) - 1; i >= 0; i-- {
		line := values[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			a, ok := parse(entry)
			if !ok {
				return cur
			}
			cur = a
			if !IsTrusted(a, trusted) {
				return a
			}
		}
	}
	return cur
}

// IsTrusted reports whether a is in one of the prefixes.
func IsTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParseHost parses "1.2.3.4", "1.2.3.4:80", "::1", "[::1]" or "[::1]:80",
// surrounding spaces allowed, and unmaps IPv4-mapped IPv6 addresses.
func ParseHost(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
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
