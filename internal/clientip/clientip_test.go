package clientip

import (
	"net/netip"
	"testing"
)

func TestWalk(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	proxy := netip.MustParseAddr("10.0.0.1")
	stranger := netip.MustParseAddr("198.51.100.9")
	cases := []struct {
		name   string
		peer   netip.Addr
		values []string
		want   string
	}{
		{"untrusted peer: header ignored", stranger, []string{"1.2.3.4"}, "198.51.100.9"},
		{"trusted peer: right-most untrusted", proxy, []string{"6.6.6.6, 1.2.3.4, 10.0.0.7"}, "1.2.3.4"},
		{"several lines", proxy, []string{"6.6.6.6", "1.2.3.4"}, "1.2.3.4"},
		{"all trusted: left-most", proxy, []string{"10.1.1.1, 10.2.2.2"}, "10.1.1.1"},
		{"garbage ends the walk at the last trusted hop", proxy, []string{"1.2.3.4, junk, 10.0.0.7"}, "10.0.0.7"},
		{"no header", proxy, nil, "10.0.0.1"},
		{"ports, brackets and mapped addresses", proxy, []string{"[::ffff:1.2.3.4]:80"}, "1.2.3.4"},
	}
	for _, c := range cases {
		if got := Walk(c.peer, c.values, trusted, ParseHost); got.String() != c.want {
			t.Errorf("%s: Walk = %s, want %s", c.name, got, c.want)
		}
	}
	if got := Walk(proxy, []string{"1.2.3.4"}, nil, ParseHost); got != proxy {
		t.Errorf("no trusted proxies: Walk = %s, want the peer", got)
	}
}
