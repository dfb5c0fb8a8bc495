package grpcx

import (
	"net/netip"

	"github.com/spillway-go/spillway/internal/clientip"
)

// ForwardedForKey is the metadata key read from trusted proxies (see
// ServerSettings.TrustedProxies).
const ForwardedForKey = "x-forwarded-for"

// clientIP is the client address behind trusted proxies (see
// internal/clientip.Walk) from the x-forwarded-for metadata values.
func clientIP(peer netip.Addr, values []string, trusted []netip.Prefix) netip.Addr {
	return clientip.Walk(peer, values, trusted, clientip.ParseHost)
}
