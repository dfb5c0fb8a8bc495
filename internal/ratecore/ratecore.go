// Package ratecore carries what package ratelimit shares with its sibling
// packages only (fallback, tiers, and the rls, loadtest and bench modules):
// the checks a store runs before a reservation, the plumbing of holds and
// stores that a wrapping store or the tiers limiter needs, and the policy
// arithmetic they share. They live here so that ratelimit's exported
// surface is what a user calls.
//
// ratelimit registers its functions at init; a package that imports
// ratelimit gets them typed with Get.
package ratecore

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
)

// Hooks are ratelimit's functions for its siblings, typed by ratelimit's
// Item (I), *Hold (H), Policy (P) and SettleResult (R).
type Hooks[I, H, P, R any] struct {
	// ValidateReserve reports what is wrong with a reservation of items
	// for ttl, as the stores check before touching any state, so that a
	// wrapping store never mistakes bad input for a failing backend.
	ValidateReserve func(items []I, ttl time.Duration) error
	// DeniedHold returns a hold that holds nothing, with these decisions
	// (at least one not allowed); its Settle returns an error matching
	// ErrNotHeld.
	DeniedHold func(decisions []spillway.Decision) H

	// ErrNotHeld is returned by the settles of a hold whose reservation
	// was denied: nothing was held.
	ErrNotHeld error
	// ErrNotSent is wrapped by the error SettleAsync's then gets when the
	// store did not send the settle (queue full, store closed, Redis out
	// of reach until the hold's TTL): the hold is left to its TTL.
	ErrNotSent error

	// Allowed reports whether every item of the hold was admitted (and so
	// holds).
	Allowed func(h H) bool
	// Decisions returns the hold's decisions, one per item, in order. The
	// slice belongs to the hold; a wrapping store may adjust it (marking
	// decisions Degraded) before handing the hold on.
	Decisions func(h H) []spillway.Decision
	// SettleEach settles each item of the hold with its own actual cost.
	SettleEach func(ctx context.Context, h H, actual []int64) ([]R, error)
	// SettleAsync hands the settle to the store's background path and
	// calls then once with the results or the error (see ErrNotSent).
	SettleAsync func(h H, actual []int64, then func([]R, error)) error

	// EffectiveBurst is the policy's Burst, or Limit when Burst is 0.
	EffectiveBurst func(p P) int64
	// EmissionInterval is T = ceil(Period/Limit) in µs.
	EmissionInterval func(p P) int64
	// EffectiveBuckets is Buckets, or DefaultBuckets when it is 0.
	EffectiveBuckets func(p P) int64
	// Window is the span the policy's Limit applies to: the Window of
	// the decisions Limiter and tiers return, and the w= of the IETF
	// RateLimit-Policy header (0 for a policy that does not validate).
	Window func(p P) time.Duration

	// Client returns the go-redis client a store sends through (a
	// RedisStore's), or nil.
	Client func(store any) redis.UniversalClient
	// SetGate hands a store that sends settles in the background (a
	// RedisStore) a gate: nothing is sent while gate returns false. It
	// reports false for a store that takes none.
	SetGate func(store any, gate func() bool) bool
	// Flush sends now what a store queued to send in the background (a
	// RedisStore's settles) and waits for the answers or ctx; a store
	// that queues nothing returns nil.
	Flush func(ctx context.Context, store any) error
	// Len returns the number of keys a MemoryStore holds (-1 for another
	// store).
	Len func(store any) int
}

var hooks any

// Register installs ratelimit's hooks (called once, from ratelimit's init).
func Register[I, H, P, R any](h Hooks[I, H, P, R]) { hooks = h }

// Get returns the hooks Register installed; the type arguments must be
// the types ratelimit registered (ratelimit.Item, *ratelimit.Hold,
// ratelimit.Policy, ratelimit.SettleResult).
func Get[I, H, P, R any]() Hooks[I, H, P, R] { return hooks.(Hooks[I, H, P, R]) }
