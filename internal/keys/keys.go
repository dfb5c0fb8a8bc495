// Package keys builds every Redis key spillway writes, in one place.
//
// A physical key is prefix + scope + ":{" + entity + "}" (another
// separator than ':' makes a layout of its own: KeyWith). The entity (an IP,
// a user id, an API key, possibly with its dimension name) is the Redis
// Cluster hash tag, so all state of one entity lives in one slot and
// different entities spread over the cluster; there is never one tag for
// everything. User-supplied text cannot pick the slot or collide with
// another scope: '%', '{', '}' and a leading '#' are percent-encoded, so the
// only braces in a key are ours, and a value longer than MaxPart bytes is
// replaced by '#' and a SHA-256 digest (base64url, 22 characters) of it.
package keys

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
)

// MaxPart is the longest scope or entity kept verbatim; longer ones are
// hashed so an attacker cannot make keys (and Redis memory) grow without
// bound.
const MaxPart = 64

// Escape makes s safe inside a key: it percent-encodes '%', '{', '}' and a
// leading '#', and hashes values longer than MaxPart bytes. It returns s
// itself (no allocation) when nothing needs changing.
func Escape(s string) string {
	if len(s) > MaxPart {
		return hash(s)
	}
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '%' || c == '{' || c == '}' || (c == '#' && i == 0):
			fmt.Fprintf(&b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
	if b.Len() > MaxPart {
		return hash(s)
	}
	return b.String()
}

func needsEscape(s string) bool {
	if len(s) > 0 && s[0] == '#' {
		return true
	}
	// a byte loop: strings.ContainsAny builds its set on every call, and
	// this runs for every part of every key of every decision
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%', '{', '}':
			return true
		}
	}
	return false
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "#" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// DigestLen is the length of Digest's result.
const DigestLen = 6

// Digest returns a short name for s that is safe inside a key: the first
// 36 bits of its SHA-256 as 6 base64url characters. It names a default
// scope by its policy, so that a default key is only a few bytes longer
// than the user's key (Redis memory per key grows with the key's length).
func Digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base64.RawURLEncoding.EncodeToString(sum[:6])[:DigestLen]
}

// Key returns prefix + Escape(scope) + ":{" + Escape(entity) + "}".
func Key(prefix, scope, entity string) string { return KeyWith(prefix, scope, ':', entity) }

// Concurrency returns the Redis key of a concurrency limiter's in-flight
// set: the limiter named scope, the key key (what tests outside package
// concurrency read).
func Concurrency(prefix, scope, key string) string { return Key(prefix, "cc:"+scope, key) }

// KeyWith returns prefix + Escape(scope) + sep + "{" + Escape(entity) +
// "}": a layout of its own for each sep. The scope is escaped, so the
// first '{' of a key is always the one after sep, and keys of two layouts
// (two seps) never collide. The rate limiter's bucket family uses ';'
// since its state changed encoding, so that a version that cannot read
// the new encoding never shares a key with one that writes it.
func KeyWith(prefix, scope string, sep byte, entity string) string {
	return build(prefix, scope, sep, entity, "")
}

// KeySuffix returns Key(prefix, scope, entity) + suffix, built in one
// allocation (a rate limiter's window keys, one per item of every call).
func KeySuffix(prefix, scope, entity, suffix string) string {
	return build(prefix, scope, ':', entity, suffix)
}

func build(prefix, scope string, sep byte, entity, suffix string) string {
	scope, entity = Escape(scope), Escape(entity)
	var b strings.Builder
	b.Grow(len(prefix) + len(scope) + len(entity) + 3 + len(suffix))
	b.WriteString(prefix)
	b.WriteString(scope)
	b.WriteByte(sep)
	b.WriteByte('{')
	b.WriteString(entity)
	b.WriteByte('}')
	b.WriteString(suffix)
	return b.String()
}

// ValidatePrefix reports a prefix that would break the hash-tag scheme.
func ValidatePrefix(prefix string) error {
	if strings.ContainsAny(prefix, "{}") {
		return fmt.Errorf("keys: prefix %q must not contain '{' or '}' (it would become the cluster hash tag)", prefix)
	}
	return nil
}

// Tag returns the hash tag of a key built by Key: the text between the
// first '{' and the next '}', as Redis Cluster reads it.
func Tag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}
