package fallback

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/budget"
	"github.com/spillway-go/spillway/internal/ratecore"
	"github.com/spillway-go/spillway/ratelimit"
)

// reserver is a store that can hold estimates (ratelimit.MemoryStore,
// ratelimit.RedisStore, a Store).
type reserver interface {
	ratelimit.Store
	Reserve(ctx context.Context, items []ratelimit.Item, ttl time.Duration) (*ratelimit.Hold, error)
}

var _ reserver = (*Store)(nil)

// rateHooks are ratelimit's functions shared with its siblings only.
var rateHooks = ratecore.Get[ratelimit.Item, *ratelimit.Hold, ratelimit.Policy, ratelimit.SettleResult]()

// CanReserve reports whether Reserve can hold: nil when the inner and the
// local store both have a Reserve method, else an error wrapping
// ratelimit.ErrHoldUnsupported. tiers.New asks it, so that a config with
// "cost: response" rules over a Store that cannot hold is refused when it
// is built, not at every request.
func (s *Store) CanReserve() error {
	if _, ok := s.inner.(reserver); !ok {
		return fmt.Errorf("fallback: %w: inner store %T has no Reserve method", ratelimit.ErrHoldUnsupported, s.inner)
	}
	if _, ok := s.local.(reserver); !ok {
		return fmt.Errorf("fallback: %w: local store %T has no Reserve method", ratelimit.ErrHoldUnsupported, s.local)
	}
	return nil
}

// Reserve holds estimates (reserve, then settle the actual
// cost), with what Decide adds: the inner store holds, under the time
// budget and the breaker, when it is a reserver and answers;
// when it cannot, the local share holds instead — the decisions marked
// Degraded, a fail-closed item denying the reservation (nothing held) —
// exactly as Decide decides locally.
//
// A Hold settles with the store that made it: a hold made locally settles
// locally (the local share gives back or charges the difference); one made
// by the inner store settles there, and if that store cannot answer then,
// Settle returns its error and the inner store releases the hold at its
// TTL (the work is then not charged there). Reconcile carries back the
// estimates of the holds made locally, as admitted, not their settled
// costs. Bad input (what ratelimit's stores reject before touching state) is an error and never
// counts against the breaker; an inner store without a Reserve method makes
// every Reserve fail with ratelimit.ErrHoldUnsupported.
func (s *Store) Reserve(ctx context.Context, items []ratelimit.Item, ttl time.Duration) (*ratelimit.Hold, error) {
	inner, ok := s.inner.(reserver)
	if !ok {
		return nil, fmt.Errorf("fallback: %w: inner store %T has no Reserve method", ratelimit.ErrHoldUnsupported, s.inner)
	}
	local, ok := s.local.(reserver)
	if !ok {
		return nil, fmt.Errorf("fallback: %w: local store %T has no Reserve method", ratelimit.ErrHoldUnsupported, s.local)
	}
	if err := rateHooks.ValidateReserve(items, ttl); err != nil {
		return nil, fmt.Errorf("fallback: %w", err)
	}
	if len(items) == 0 {
		return inner.Reserve(ctx, items, ttl) // holds nothing, calls nothing
	}
	deadline, ok := budget.Deadline(ctx, s.set.Budget)
	if !ok {
		return s.reserveLocal(ctx, local, items, ttl, spillway.ErrBudgetSpent)
	}
	var h *ratelimit.Hold
	done, err := s.br.allow()
	if err == nil {
		sc := s.br.guard(ctx, deadline, s.set.Budget)
		if s.direct {
			h, err = inner.Reserve(sc.ctx, items, ttl)
		} else {
			h, err = s.reserveDetached(sc.ctx, deadline, inner, items, ttl)
		}
		sc.end()
		err = s.br.finish(ctx, done, err, sc)
	}
	if err == nil {
		s.stats.calls.Add(1)
		return h, nil
	}
	if _, ok := err.(*canceledError); ok {
		return nil, err
	}
	return s.reserveLocal(ctx, local, items, ttl, err)
}

// reserveDetached is inner.Reserve run detached (Health.detach), on a
// copy of items. A hold made after its caller gave up is given back (settled
// at 0) by the goroutine that made it.
func (s *Store) reserveDetached(ctx context.Context, deadline time.Time, inner reserver, items []ratelimit.Item, ttl time.Duration) (*ratelimit.Hold, error) {
	its := slices.Clone(items)
	var h *ratelimit.Hold
	err := s.br.detach(ctx, deadline, func(ctx context.Context) error {
		var err error
		h, err = inner.Reserve(ctx, its, ttl)
		return err
	}, func(err error) {
		if err == nil && rateHooks.Allowed(h) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.set.Budget)
			defer cancel()
			_, _ = h.Settle(ctx, 0)
		}
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// reserveLocal holds items on the local share, or denies them when one is
// fail-closed, as decideLocal decides.
func (s *Store) reserveLocal(ctx context.Context, local reserver, items []ratelimit.Item, ttl time.Duration, cause error) (*ratelimit.Hold, error) {
	s.stats.degraded.Add(1)
	scaled := make([]ratelimit.Item, len(items))
	closed := false
	ppm := s.sharePPM()
	for i := range items {
		scaled[i] = items[i]
		scaled[i].Policy = scalePolicy(items[i].Policy, ppm)
		if s.failClosed(&scaled[i]) {
			closed = true
		}
	}
	var h *ratelimit.Hold
	if closed {
		// Peek the fail-open items so their decisions say what they have
		// left; hold nothing since the reservation is denied.
		for i := range scaled {
			scaled[i].Cost = 0
		}
		out := make([]spillway.Decision, len(items))
		if _, err := s.local.Decide(ctx, scaled, out); err != nil {
			return nil, fmt.Errorf("fallback: local store: %w", err)
		}
		for i := range items {
			if s.failClosed(&items[i]) {
				out[i] = spillway.Decision{
					Reason:     spillway.ReasonFailClosed,
					Limiter:    items[i].Scope,
					Limit:      items[i].Policy.Capacity(),
					RetryAfter: s.set.OpenTimeout,
				}
			}
		}
		h = rateHooks.DeniedHold(out)
	} else {
		var err error
		h, err = local.Reserve(ctx, scaled, ttl)
		if err != nil {
			return nil, fmt.Errorf("fallback: local store: %w", err)
		}
		if rateHooks.Allowed(h) && s.ledger != nil {
			now := s.now()
			for i := range items {
				s.ledger.record(itemKey{items[i].Scope, items[i].Key, items[i].Policy}, items[i].Cost, now)
			}
		}
	}
	ev := DegradedEvent{Name: s.set.Name, Scope: items[0].Scope, Allowed: rateHooks.Allowed(h), Cause: cause}
	out := rateHooks.Decisions(h)
	for i := range out {
		d := &out[i]
		d.Degraded = true
		// A cost the full policy admits but the share cannot is not
		// "never": it can succeed once the store is back.
		if d.Reason == spillway.ReasonCostExceedsLimit && items[i].Cost <= items[i].Policy.Capacity() {
			d.Reason = spillway.ReasonRateLimited
			d.RetryAfter = s.set.OpenTimeout
		}
		if !d.Allowed && ev.Reason == spillway.ReasonNone {
			ev.Scope, ev.Reason = items[i].Scope, d.Reason
		}
	}
	if s.set.OnDegraded != nil {
		s.set.OnDegraded(ev)
	}
	return h, nil
}
