package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/keys"
)

// ErrInvalidCost is wrapped by the errors about a negative cost.
var ErrInvalidCost = errors.New("ratelimit: invalid cost")

// Limiter applies one Policy to many keys over a Store. Create it with New.
// It is safe for concurrent use.
type Limiter struct {
	store   Store
	mem     *MemoryStore // store, when it is a memory store: the allocation-free path
	policy  Policy
	lim     limits // policy in µs
	scope   string
	name    string // the Limiter of its decisions: the scope, or the policy's String() by default
	hash    uint64 // the scope's hash in mem
	fail    spillway.FailMode
	window  time.Duration // policy.window(), the Window of every decision
	holdTTL time.Duration // Settings.HoldTTL: 0 means DefaultHoldTTL
}

// defaultScope returns the scope of a Limiter of policy p made without
// Settings.Scope: the first 36 bits of the SHA-256 of p.String(), as 6
// base64url characters (e.g. "QmCX23" for "token_bucket 100/1s burst 50").
func defaultScope(p Policy) string { return keys.Digest(p.String()) }

// New returns a limiter applying p over store, configured by set (the
// zero Settings: the defaults). It returns an error when
// store is nil or p is invalid (the error wraps ErrInvalidPolicy and names
// the field).
func New(store Store, p Policy, set Settings) (*Limiter, error) {
	if store == nil {
		return nil, errors.New("ratelimit: store is nil")
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	l := &Limiter{store: store, policy: p, lim: p.limits(), scope: defaultScope(p), window: p.window()}
	if m, ok := store.(*MemoryStore); ok {
		l.mem = m
	}
	if set.Scope != "" {
		l.scope, l.name = set.Scope, set.Scope
	}
	l.fail, l.holdTTL = set.FailMode, set.HoldTTL
	if l.fail > spillway.FailClosed {
		return nil, fmt.Errorf("ratelimit: unknown fail mode %d (want spillway.FailOpen or spillway.FailClosed)", uint8(l.fail))
	}
	if l.holdTTL != 0 {
		if _, _, err := holdTTLOf(l.holdTTL); err != nil {
			return nil, err
		}
	}
	if l.name == "" {
		l.name = p.String()
	}
	if l.mem != nil {
		l.hash = l.mem.scopeHash(l.scope)
	}
	return l, nil
}

// Allow decides whether key may spend n now and charges it if so. n = 0
// peeks (always allowed, charges nothing, reports Remaining); n above the
// policy's Capacity is denied with spillway.ReasonCostExceedsLimit and
// RetryAfter 0; a negative n is an error wrapping ErrInvalidCost. A denial
// is not an error: err != nil only when the store failed.
//
// Durations in the decision are rounded up to whole milliseconds; Limit is
// the policy's Capacity; Window the time the policy takes to grant its
// Capacity from empty (Period for the windows, Capacity emission intervals
// for the bucket family: 12s for 1000/minute burst 200); Limiter is the scope
// (Settings.Scope), or the policy's String() when none was given.
func (l *Limiter) Allow(ctx context.Context, key string, n int64) (d spillway.Decision, err error) {
	if n < 0 {
		return spillway.Decision{}, fmt.Errorf("%w: n = %d is negative", ErrInvalidCost, n)
	}
	if l.mem != nil {
		l.mem.decideOne(&d, l.scope, l.hash, key, l.policy.Algorithm, &l.lim, n)
		d.Window, d.Limiter = l.window, l.name
		return d, nil
	}
	items := [1]Item{{Scope: l.scope, Key: key, Policy: l.policy, Cost: n, Fail: l.fail}}
	var out [1]spillway.Decision
	if _, err := l.store.Decide(ctx, items[:], out[:]); err != nil {
		return spillway.Decision{}, wrapf(err, "%s", l.name)
	}
	out[0].Window, out[0].Limiter = l.window, l.name
	return out[0], nil
}

// Reset forgets the state of key.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if err := l.store.Reset(ctx, l.scope, key, l.policy); err != nil {
		return wrapf(err, "%s: reset", l.name)
	}
	return nil
}

// Schedule is the smoothing form of a leaky bucket (it works for
// TokenBucket and GCRA too, whose math is the same; for the windows it
// returns an error wrapping ErrInvalidPolicy: they have no smoothing
// delay). Instead of admitting at once whatever fits in the bucket, it
// treats the bucket as a queue of Burst places drained at Limit/Period:
// the request is admitted (and charged) exactly when Allow would admit it
// — the queue has room — and delay says when its turn comes. A caller
// that waits delay before acting emits at most one request per
// Period/Limit, bursts included. A denied request gets delay 0 and the
// usual RetryAfter.
//
// delay is the time until the request's slot, computed as ResetAfter −
// n·(Period/Limit) from the millisecond-rounded ResetAfter (so every store
// gives the same figure): never shorter than the exact delay, less than a
// millisecond longer.
func (l *Limiter) Schedule(ctx context.Context, key string, n int64) (d spillway.Decision, delay time.Duration, err error) {
	switch l.policy.Algorithm {
	case FixedWindow, SlidingWindowLog, SlidingWindowCounter, SlidingWindowBuckets:
		return spillway.Decision{}, 0, fmt.Errorf("%w: %s has no smoothing delay", ErrInvalidPolicy, l.policy.Algorithm)
	}
	d, err = l.Allow(ctx, key, n)
	if err != nil || !d.Allowed {
		return d, 0, err
	}
	delay = d.ResetAfter - time.Duration(n*l.policy.emissionInterval())*time.Microsecond
	return d, max(delay, 0), nil
}

// Wait schedules n (see Schedule) and, when admitted, sleeps the delay
// before returning. A denied request returns at once with the denial (its
// RetryAfter says when the queue will have room) and a nil error. When ctx
// ends during the sleep, Wait returns the decision and an error wrapping
// ctx.Err(); the slot stays charged (a shared store cannot take it
// back without a race).
func (l *Limiter) Wait(ctx context.Context, key string, n int64) (spillway.Decision, error) {
	d, delay, err := l.Schedule(ctx, key, n)
	if err != nil || !d.Allowed || delay <= 0 {
		return d, err
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return d, nil
	case <-ctx.Done():
		return d, fmt.Errorf("ratelimit: %s: wait: %w", l.name, ctx.Err())
	}
}

// dimensionLimiter is a Limiter keyed by one dimension of a
// spillway.Request; see PerKey.
type dimensionLimiter struct {
	l       *Limiter
	dim     string
	scope   string
	name    string // the Limiter of its decisions: "<l's name>:<dim>"
	hash    uint64 // the scope's hash in the memory store
	missing string
}

// PerKey adapts l to a spillway.Limiter that keys each request by the
// value of its dimension dim (spillway.DimIP, spillway.DimUser, …; see
// spillway.Request.Get) and charges Request.EffectiveCost.
//
// Its state lives under the scope "<l's scope>:<dim>", so adapters over
// different dimensions never share state; its decisions are named
// "<l's name>:<dim>" (the name is the scope, or the policy's String() when
// l has no Settings.Scope). A request without the dimension is allowed without
// being charged, with Limit 0 (a Chain then ignores it for headers) and the
// Limiter name "<name>:<dim>:absent", so the gap is visible in telemetry;
// put a limiter that denies such requests in front if that is wrong for
// you. A nil or malformed request (spillway.Request.Validate) is denied with
// spillway.ReasonInvalid. A store failure returns a *spillway.StoreError
// carrying the limiter's fail mode (Settings.FailMode). Done is spillway.Noop: a
// rate limit has nothing to release.
func PerKey(l *Limiter, dim string) spillway.Limiter {
	scope, name := l.scope+":"+dim, l.name+":"+dim
	d := &dimensionLimiter{l: l, dim: dim, scope: scope, name: name, missing: name + ":absent"}
	if l.mem != nil {
		d.hash = l.mem.scopeHash(scope)
	}
	return d
}

// Admit implements spillway.Limiter.
func (d *dimensionLimiter) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	if r.Validate() != nil {
		return spillway.Decision{Reason: spillway.ReasonInvalid, Limiter: d.name}, spillway.Noop, nil
	}
	v, ok := r.Get(d.dim)
	if !ok {
		return spillway.Decision{Allowed: true, Limiter: d.missing}, spillway.Noop, nil
	}
	l := d.l
	n := r.EffectiveCost()
	if l.mem != nil {
		var dec spillway.Decision
		l.mem.decideOne(&dec, d.scope, d.hash, v, l.policy.Algorithm, &l.lim, n)
		dec.Window, dec.Limiter = l.window, d.name
		return dec, spillway.Noop, nil
	}
	items := [1]Item{{Scope: d.scope, Key: v, Policy: l.policy, Cost: n, Fail: l.fail}}
	var out [1]spillway.Decision
	if _, err := l.store.Decide(ctx, items[:], out[:]); err != nil {
		return spillway.Decision{}, spillway.Noop, &spillway.StoreError{Limiter: d.name, Fail: l.fail, Err: err}
	}
	out[0].Window, out[0].Limiter = l.window, d.name
	return out[0], spillway.Noop, nil
}
