package tiers

import (
	"errors"
	"net/netip"
	"strings"
)

// checkEndpoint validates an endpoint pattern: empty or "*" (everything), or
// a path starting with '/' whose '*' are whole segments.
func checkEndpoint(s string) error {
	if s == "" || s == "*" {
		return nil
	}
	if s[0] != '/' {
		return errors.New("must start with '/' (or be \"*\" for every endpoint)")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return errors.New("must not contain spaces or control characters")
		}
	}
	for _, seg := range strings.Split(s[1:], "/") {
		if strings.Contains(seg, "*") && seg != "*" {
			return errors.New("'*' must be a whole path segment (\"/api/*\", not \"/api*\")")
		}
	}
	return nil
}

// matcher matches Request.Endpoint against a compiled pattern.
type matcher struct {
	all   bool
	exact string   // when !wild
	wild  bool     // the pattern has '*' segments
	segs  []string // the segments before a trailing "/*"
	tail  bool     // the pattern ends in "/*": the rest may be anything
}

func newMatcher(pattern string) matcher {
	if pattern == "" || pattern == "*" {
		return matcher{all: true}
	}
	if !strings.Contains(pattern, "*") {
		return matcher{exact: pattern}
	}
	m := matcher{wild: true}
	segs := strings.Split(pattern[1:], "/")
	if segs[len(segs)-1] == "*" {
		m.tail = true
		segs = segs[:len(segs)-1]
	}
	m.segs = segs
	return m
}

// match reports whether path matches. "/api/v1/*" matches "/api/v1" and
// everything below it; a "*" segment in the middle matches exactly one
// non-empty segment.
func (m *matcher) match(path string) bool {
	if m.all {
		return true
	}
	if !m.wild {
		return path == m.exact
	}
	if path == "" || path[0] != '/' {
		return false
	}
	rest := path
	for _, seg := range m.segs {
		if rest == "" || rest[0] != '/' {
			return false
		}
		rest = rest[1:]
		j := strings.IndexByte(rest, '/')
		if j < 0 {
			j = len(rest)
		}
		s := rest[:j]
		rest = rest[j:]
		if seg == "*" {
			if s == "" {
				return false
			}
		} else if seg != s {
			return false
		}
	}
	return m.tail || rest == ""
}

// normalizeIP returns the canonical text of an IP address (lower case,
// IPv4-mapped IPv6 unmapped, zone and brackets dropped) so that one client
// cannot get several counters by spelling its address differently. With
// v6bits in 1..127, an IPv6 address becomes its /v6bits prefix
// ("2001:db8:1:2::/64"): one host usually owns a whole /64, so per-address
// limits would give it 2^64 buckets. Text that is not an IP is returned
// as is (internal/keys escapes it).
func normalizeIP(s string, v6bits int) string {
	t := strings.TrimSpace(s)
	if len(t) > 2 && t[0] == '[' && t[len(t)-1] == ']' {
		t = t[1 : len(t)-1]
	}
	a, err := netip.ParseAddr(t)
	if err != nil {
		return s
	}
	if a.Is4() && len(t) == len(s) {
		// ParseAddr takes IPv4 only in its canonical dotted form, which
		// is what String would make again: no allocation on the common path
		return s
	}
	a = a.WithZone("").Unmap()
	if a.Is6() && v6bits > 0 && v6bits < 128 {
		if p, err := a.Prefix(v6bits); err == nil {
			return p.String()
		}
	}
	return a.String()
}

// appendValue appends v to b, percent-encoding '%' and ',' so that the
// values of a multi-dimension entity cannot run into each other.
func appendValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '%':
			b = append(b, "%25"...)
		case ',':
			b = append(b, "%2C"...)
		default:
			b = append(b, c)
		}
	}
	return b
}
