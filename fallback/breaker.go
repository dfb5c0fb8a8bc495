package fallback

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// errExcluded is reported to the breaker for calls that say nothing about
// the store's health: the caller went away.
var errExcluded = errors.New("fallback: excluded")

// breaker is the two-step gobreaker with the budget and the error
// classification every wrapper shares.
type breaker struct {
	cb  *gobreaker.TwoStepCircuitBreaker[struct{}]
	set Settings
	// openUntil (Unix ns, 0 when not open) lets allow refuse without
	// taking gobreaker's lock while the breaker is open: during an outage
	// every request would otherwise serialize on it.
	openUntil atomic.Int64
}

func newBreaker(s Settings) *breaker {
	b := &breaker{set: s}
	k := s.Failures
	st := gobreaker.Settings{
		Name:        s.Name,
		MaxRequests: s.Probes,
		Timeout:     s.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= k },
		IsExcluded:  func(err error) bool { return errors.Is(err, errExcluded) },
	}
	hook := s.OnStateChange
	st.OnStateChange = func(name string, from, to gobreaker.State) {
		if to == gobreaker.StateOpen {
			b.openUntil.Store(time.Now().Add(s.OpenTimeout).UnixNano())
		} else {
			b.openUntil.Store(0)
		}
		if hook != nil {
			hook(name, stateOf(from), stateOf(to))
		}
	}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	return b
}

func stateOf(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	}
	return Closed
}

func (b *breaker) state() State { return stateOf(b.cb.State()) }

// allow is cb.Allow with a lock-free refusal while open.
func (b *breaker) allow() (func(error), error) {
	if u := b.openUntil.Load(); u != 0 && time.Now().UnixNano() <= u {
		return nil, ErrOpen
	}
	done, err := b.cb.Allow()
	if err != nil {
		return nil, ErrOpen
	}
	return done, nil
}

// call runs f under the breaker and the budget. It returns ErrOpen when the
// breaker refused, the caller's cancellation as a *canceledError (not
// counted), and any other failure (the budget's deadline included) counted
// against the store.
func (b *breaker) call(ctx context.Context, f func(ctx context.Context) error) error {
	done, err := b.allow()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, b.set.Budget)
	err = f(cctx)
	cancel()
	return b.finish(ctx, done, err)
}

// bypass runs f under the budget unless the breaker is open, without
// reporting to the breaker: for reconcile, whose calls must neither take
// the half-open probe slots of real traffic nor reopen the breaker on a
// stale pooled connection (a failed pass is simply retried later).
func (b *breaker) bypass(ctx context.Context, f func(ctx context.Context) error) error {
	if b.state() == Open {
		return ErrOpen
	}
	cctx, cancel := context.WithTimeout(ctx, b.set.Budget)
	defer cancel()
	return f(cctx)
}

// finish reports the outcome err of a call the breaker allowed (done) and
// classifies it as call does; ctx is the caller's context.
func (b *breaker) finish(ctx context.Context, done func(error), err error) error {
	switch {
	case err == nil:
		done(nil)
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up; that says nothing about the store. A caller
		// deadline shorter than the budget does count: the store was too
		// slow for this caller.
		done(errExcluded)
		return &canceledError{err: ctx.Err()}
	default:
		done(err)
		return err
	}
}

// canceledError marks a call the caller canceled: it is returned, not
// decided locally.
type canceledError struct{ err error }

func (e *canceledError) Error() string { return "fallback: caller canceled: " + e.err.Error() }
func (e *canceledError) Unwrap() error { return e.err }
