package grpcx

import (
	"net/netip"
	"strings"
)

// ForwardedForKey is the metadata key read from trusted proxies (see
// WithTrustedProxies).
const ForwardedForKey = "x-forwarded-for"

// clientIP walks the x-forwarded-for values from the right, starting at a
// trusted peer, and returns the first address that is not a trusted proxy
// (the left-most if all are). An unparsable entry ends the walk at the
// last trusted hop.
func clientIP(peer netip.Addr, values []string, trusted []netip.Prefix) netip.Addr {
	if len(trusted) == 0 || !isTrusted(peer, trusted) {
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
			a, ok := parseHost(strings.TrimSpace(entry))
			if !ok {
				return cur
			}
			cur = a
			if !isTrusted(a, trusted) {
				return a
			}
		}
	}
	return cur
}

func isTrusted(a netip.Addr, trusted []netip.Prefix) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

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
