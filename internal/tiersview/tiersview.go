// Package tiersview lets the tests of tiers' siblings (fallback) see what
// a tiers.Limiter keeps to itself: the store items it would decide for a
// request. It lives here so that tiers' exported surface is what a user
// calls.
//
// tiers fills the function at init; it takes a *tiers.Limiter as any.
package tiersview

import (
	"context"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// Items returns the store items the *tiers.Limiter lim would decide for
// r, one per matching rule in config order, without deciding anything.
var Items func(ctx context.Context, lim any, r *spillway.Request) ([]ratelimit.Item, error)
