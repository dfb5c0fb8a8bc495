// Package ratecore carries what package ratelimit shares with its sibling
// packages only (fallback): the check a store runs before a reservation
// and the hold a wrapping store returns when it denies one itself. They
// live here so that ratelimit's exported surface is what a user calls.
//
// ratelimit registers its functions at init; a package that imports
// ratelimit gets them typed with Get.
package ratecore

import (
	"time"

	"github.com/spillway-go/spillway"
)

// Hooks are ratelimit's functions for its siblings, typed by ratelimit's
// Item (I) and *Hold (H).
type Hooks[I, H any] struct {
	// ValidateReserve reports what is wrong with a reservation of items
	// for ttl, as the stores check before touching any state, so that a
	// wrapping store never mistakes bad input for a failing backend.
	ValidateReserve func(items []I, ttl time.Duration) error
	// DeniedHold returns a hold that holds nothing, with these decisions
	// (at least one not allowed); its Settle returns ratelimit.ErrNotHeld.
	DeniedHold func(decisions []spillway.Decision) H
}

var hooks any

// Register installs ratelimit's hooks (called once, from ratelimit's init).
func Register[I, H any](h Hooks[I, H]) { hooks = h }

// Get returns the hooks Register installed; I and H must be the types
// ratelimit registered (ratelimit.Item, *ratelimit.Hold).
func Get[I, H any]() Hooks[I, H] { return hooks.(Hooks[I, H]) }
