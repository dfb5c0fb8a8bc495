// Package fallbackview lets the siblings of package fallback (the rls
// service) read what a fallback Store and Health keep to themselves: the
// health a client or a store uses and a store's local decisions. They live
// here so that fallback's exported surface is what a user calls.
//
// fallback fills the functions at init; they take and return fallback's
// types as any (*fallback.Store, *fallback.Health).
package fallbackview

import "github.com/redis/go-redis/v9"

var (
	// HealthOf returns the *fallback.Health that fallback.NewHealth
	// attached to client, or nil.
	HealthOf func(client redis.UniversalClient) any
	// StoreHealth returns the *fallback.Health a *fallback.Store uses (its
	// Settings.Health, or its own).
	StoreHealth func(store any) any
	// StoreDegraded returns the decisions a *fallback.Store made locally
	// (degraded) since it was created, and of those the ones whose time
	// was spent in this process rather than by Redis (overloaded).
	StoreDegraded func(store any) (degraded, overloaded int64)
	// StoreRefused returns the calls a *fallback.Store refused, undecided,
	// because their budget ran out in this process (overload).
	StoreRefused func(store any) int64
)
