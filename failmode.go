package spillway

import (
	"errors"
	"fmt"
	"strings"
)

// FailMode says what a limit wants when its shared store cannot answer. It
// is one vocabulary for the whole toolkit: a tiers rule's `fail:` field, a
// ratelimit.Item (and so every item of a store batch), the fallback
// wrappers and the adapters' default all use it. The zero value is
// FailOpen.
type FailMode uint8

const (
	// FailOpen: when the store is unavailable, admit — or let a local
	// fallback limit (package fallback) decide, marked Degraded. A store
	// outage does not take the API down.
	FailOpen FailMode = iota
	// FailClosed: when the store is unavailable, deny with
	// ReasonFailClosed (503): for limits where a burst past the limit is
	// worse than an error, such as login.
	FailClosed
)

// String returns "open" or "closed", as written in configs.
func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	}
	return fmt.Sprintf("failmode(%d)", uint8(m))
}

// ParseFailMode parses "open" or "closed" (case and surrounding spaces do
// not matter; "fail_open" and "fail-closed" are accepted too).
func ParseFailMode(s string) (FailMode, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimPrefix(strings.TrimPrefix(t, "fail_"), "fail-")
	switch t {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("spillway: unknown fail mode %q (want open or closed)", s)
}

// MarshalText implements encoding.TextMarshaler ("open", "closed").
func (m FailMode) MarshalText() ([]byte, error) {
	if m > FailClosed {
		return nil, fmt.Errorf("spillway: unknown fail mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseFailMode.
func (m *FailMode) UnmarshalText(b []byte) error {
	v, err := ParseFailMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ErrStoreUnavailable is matched (errors.Is) by every *StoreError: a
// block's shared store failed and nothing below it decided.
var ErrStoreUnavailable = errors.New("spillway: store unavailable")

// StoreError is the error a block's Admit returns when its shared store
// failed and nothing decided the request. It carries the fail mode the
// request's limits want, so whoever handles the error (a fallback wrapper,
// the adapters) admits or denies the way the limits were configured,
// whatever its own default. errors.Is(err, ErrStoreUnavailable) is true,
// and errors.Is/As see the store's own error through Unwrap.
type StoreError struct {
	// Limiter names the block whose store failed ("tiers", a scope).
	Limiter string
	// Fail is FailClosed when any enforced limit the request met is
	// fail-closed, else FailOpen.
	Fail FailMode
	// Rules are the rules or scopes the failure affects, the fail-closed
	// ones first; it may be empty.
	Rules []string
	// Err is the store's error.
	Err error
}

// Error says which block and rules the failure affects, their fail mode
// and why: "spillway: store unavailable (tiers, rules [login all], fail
// closed): connection refused".
func (e *StoreError) Error() string {
	var b strings.Builder
	b.WriteString("spillway: store unavailable (")
	if e.Limiter != "" {
		b.WriteString(e.Limiter)
		b.WriteString(", ")
	}
	if len(e.Rules) > 0 {
		fmt.Fprintf(&b, "rules %v, ", e.Rules)
	}
	b.WriteString("fail ")
	b.WriteString(e.Fail.String())
	b.WriteString(")")
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns ErrStoreUnavailable and the store's error, so errors.Is
// and errors.As see both.
func (e *StoreError) Unwrap() []error { return []error{ErrStoreUnavailable, e.Err} }
