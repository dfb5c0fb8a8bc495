package fallback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/degrade"
)

// Limiter wraps a spillway.Limiter of your own whose backend may fail
// with the time budget and the circuit breaker. The library's Redis
// blocks (a concurrency limiter, concurrency.NewInFlight, the global
// ceiling, the fleet shedder) need no wrapper: they fall back by
// themselves at the client's share. When the inner limiter errs or the
// breaker is open, the request is decided by the local limiter (its
// decision marked Degraded) or, without one, admitted; with Settings.Fail
// = spillway.FailClosed it is denied with spillway.ReasonFailClosed
// instead. The inner limiter's errors never reach the caller, except the
// caller's own cancellation. A request the local limiter
// calls too big for it (spillway.ReasonCostExceedsLimit, "never retry") is
// denied with spillway.ReasonFailClosed and RetryAfter = OpenTimeout
// instead: the local limiter holds a share of the limit, so only the inner
// limiter can say never.
//
// Settings.DenyCacheSize, LedgerSize and Local do not apply: the wrapper
// knows nothing of the inner limiter's keys. Build the local limiter with
// the share yourself, e.g. ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), // fallback.ScalePolicy(p, 0.2), ratelimit.Settings{}).
//
// A Limiter is safe for concurrent use.
type Limiter struct {
	inner spillway.Limiter
	local spillway.Limiter
	set   Settings
	br    *Health
}

var _ spillway.Limiter = (*Limiter)(nil)

// NewLimiter wraps inner; local may be nil. It returns an error naming the
// field when s is invalid or inner is nil.
func NewLimiter(inner, local spillway.Limiter, s Settings) (*Limiter, error) {
	if inner == nil {
		return nil, errors.New("fallback: inner limiter is nil")
	}
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	l := &Limiter{inner: inner, local: local, set: s, br: s.health(nil)}
	l.br.noteBudget(s.Budget)
	return l, nil
}

// State returns the breaker's state (its Health's, when shared).
func (l *Limiter) State() State { return l.br.state() }

// Health returns the breaker the Limiter uses: Settings.Health, or its own.
func (l *Limiter) Health() *Health { return l.br }

// Admit implements spillway.Limiter.
func (l *Limiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if !r.Valid() {
		// Before the breaker: an open one must not admit it locally.
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: l.set.Name}, spillway.Noop, nil
	}
	var (
		d    spillway.Decision
		done spillway.Done
	)
	// A telemetry.Instrument inside counts the local decision that
	// replaces its error, degraded, not the error.
	sc := degrade.Fallback(ctx)
	err := l.br.call(sc, l.set.Budget, l.br.direct, func(ctx context.Context) error {
		var err error
		d, done, err = l.inner.Admit(ctx, r)
		return err
	}, func(err error) {
		// Abandoned: the caller was decided locally; give back what the
		// late admission took.
		if err == nil && d.Allowed && done != nil {
			done(spillway.Ignored)
		}
	})
	if err == nil {
		if done == nil {
			return d, spillway.Noop, nil
		}
		return d, l.release(done), nil
	}
	if _, ok := err.(*canceledError); ok { // finish returns it unwrapped
		sc.Resolve(spillway.Decision{}, err)
		return spillway.Decision{}, spillway.Noop, err
	}
	// Fresh variables: an abandoned inner call may still write d and done.
	ld, ldone, lerr := l.degrade(ctx, r, err)
	sc.Resolve(ld, lerr)
	return ld, ldone, lerr
}

// release wraps the inner limiter's done (a release on the backend): it
// never waits on a backend the health has given up on. While the health
// is not closed, the release is queued (HealthSettings.MaxQueued per
// Health) and runs once the health closes, or, when the queue is full,
// left to the inner limiter's TTL; while it is closed, it runs at once —
// detached when the client does not honour deadlines, so that done
// returns within the budget whatever the client.
func (l *Limiter) release(done spillway.Done) spillway.Done {
	return spillway.Once(func(o spillway.Outcome) {
		if !l.br.closed.Load() {
			l.br.after.add(func() { done(o) })
			return
		}
		if l.br.direct {
			done(o)
			return
		}
		_ = l.br.detach(context.Background(), time.Now().Add(l.set.Budget), func(context.Context) error {
			done(o)
			return nil
		}, nil)
	})
}

func (l *Limiter) degrade(ctx context.Context, r *spillway.Request, cause error) (spillway.Decision, spillway.Done, error) {
	var (
		d    spillway.Decision
		done spillway.Done = spillway.Noop
	)
	switch {
	case l.set.Fail == spillway.FailClosed:
		d = spillway.Decision{Reason: spillway.ReasonFailClosed, Limiter: l.set.Name, RetryAfter: l.set.OpenTimeout}
	case l.local != nil:
		var err error
		d, done, err = l.local.Admit(ctx, r)
		if err != nil {
			return spillway.Decision{}, spillway.Noop, fmt.Errorf("fallback: local limiter: %w", err)
		}
		if done == nil {
			done = spillway.Noop
		}
		if !d.Allowed && d.Reason == spillway.ReasonCostExceedsLimit {
			// "Never" is the inner limiter's answer to give, not the local
			// share's: a cost above the share may fit the full limit once
			// the backend is back, so the request is refused for now.
			d.Reason, d.RetryAfter = spillway.ReasonFailClosed, l.set.OpenTimeout
		}
	default:
		d = spillway.Decision{Allowed: true, Limiter: l.set.Name}
	}
	d.Degraded = true
	if l.set.OnDegraded != nil {
		l.set.OnDegraded(DegradedEvent{Name: l.set.Name, Scope: r.Endpoint, Allowed: d.Allowed, Reason: d.Reason, Cause: cause})
	}
	return d, done, nil
}
