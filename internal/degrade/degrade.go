// Package degrade tells a telemetry wrapper that sits inside a fallback
// which local decision replaced the error it saw, so that the decision is
// counted as what it was — degraded, allowed or denied — rather than as an
// error. A fallback (the Guard's local limiter, fallback.Limiter) marks
// the context it gives its inner limiter with Fallback and, once it has
// decided, calls Resolve; a wrapper that sees an error under such a
// context hands its record to Defer instead of recording the error.
package degrade

import (
	"context"
	"sync"

	"github.com/spillway-go/spillway"
)

type key struct{}

// Scope is the context of one call whose error a local decision replaces.
// It is a context.Context: its Value finds itself, everything else is its
// parent's.
type Scope struct {
	context.Context
	mu       sync.Mutex
	pending  []func(spillway.Decision, error)
	resolved bool
	d        spillway.Decision
	err      error
}

// Value returns s for this package's key, else the parent's value.
func (s *Scope) Value(k any) any {
	if k == (key{}) {
		return s
	}
	return s.Context.Value(k)
}

// Fallback returns a context for the inner call of a fallback; the
// fallback must call Resolve on it once it has decided.
func Fallback(ctx context.Context) *Scope { return &Scope{Context: ctx} }

// Resolve gives what the fallback decided (the inner decision when the
// inner call did not fail) to the wrappers that deferred their record.
// A wrapper that defers after Resolve (a call abandoned at the budget
// that failed later) is told at once.
func (s *Scope) Resolve(d spillway.Decision, err error) {
	s.mu.Lock()
	if s.resolved {
		s.mu.Unlock()
		return
	}
	s.resolved, s.d, s.err = true, d, err
	fns := s.pending
	s.pending = nil
	s.mu.Unlock()
	for _, f := range fns {
		f(d, err)
	}
}

// Defer reports whether a fallback will replace an error seen under ctx;
// if so, f is called with what it decided (from Resolve) and the caller
// records nothing now.
func Defer(ctx context.Context, f func(spillway.Decision, error)) bool {
	s, ok := ctx.Value(key{}).(*Scope)
	if !ok {
		return false
	}
	s.mu.Lock()
	if s.resolved {
		d, err := s.d, s.err
		s.mu.Unlock()
		f(d, err)
		return true
	}
	s.pending = append(s.pending, f)
	s.mu.Unlock()
	return true
}
