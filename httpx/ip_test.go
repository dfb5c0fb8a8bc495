package httpx_test

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/spillway-go/spillway/httpx"
	"github.com/stretchr/testify/require"
)

func TestClientIP(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cases := []struct {
		name   string
		remote string
		header string
		values []string
		want   string
		ok     bool
	}{
		{"untrusted peer, header ignored", "203.0.113.1:5000", "X-Forwarded-For", []string{"1.2.3.4"}, "203.0.113.1", true},
		{"trusted peer, no header", "10.0.0.1:5000", "X-Forwarded-For", nil, "10.0.0.1", true},
		{"right-most untrusted", "10.0.0.1:5000", "X-Forwarded-For", []string{"6.6.6.6, 198.51.100.1, 10.9.9.9"}, "198.51.100.1", true},
		{"several header lines", "10.0.0.1:5000", "X-Forwarded-For", []string{"6.6.6.6", "198.51.100.2", "10.2.2.2"}, "198.51.100.2", true},
		{"all trusted: left-most", "10.0.0.1:5000", "X-Forwarded-For", []string{"10.3.3.3, 10.2.2.2"}, "10.3.3.3", true},
		{"garbage stops the walk at the last trusted hop", "10.0.0.1:5000", "X-Forwarded-For", []string{"6.6.6.6, nonsense, 10.2.2.2"}, "10.2.2.2", true},
		{"entry with port", "10.0.0.1:5000", "X-Forwarded-For", []string{"198.51.100.3:1234"}, "198.51.100.3", true},
		{"ipv6 peer unmapped", "[::ffff:203.0.113.5]:80", "X-Forwarded-For", nil, "203.0.113.5", true},
		{"ipv6 trusted peer", "[fd00::1]:80", "X-Forwarded-For", []string{"2001:db8::1"}, "2001:db8::1", true},
		{"forwarded", "10.0.0.1:5000", "Forwarded", []string{`for=6.6.6.6, for="[2001:db8::2]:99";proto=https;by=10.0.0.1`}, "2001:db8::2", true},
		{"forwarded, for not first", "10.0.0.1:5000", "Forwarded", []string{`proto=http;For=198.51.100.4`}, "198.51.100.4", true},
		{"forwarded unknown", "10.0.0.1:5000", "Forwarded", []string{`for=unknown`}, "10.0.0.1", true},
		{"unix socket peer", "@", "X-Forwarded-For", nil, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			for _, v := range tc.values {
				r.Header.Add(tc.header, v)
			}
			got, ok := httpx.ClientIP(r, trusted, tc.header)
			require.Equal(t, tc.ok, ok)
			if ok {
				require.Equal(t, tc.want, got.String())
			}
		})
	}
}
