package rls

import (
	"github.com/spillway-go/spillway/internal/ratecore"
	"github.com/spillway-go/spillway/ratelimit"
)

// rateHooks are ratelimit's functions for its siblings (the policy's
// window, for the RateLimit-Policy header).
var rateHooks = ratecore.Get[ratelimit.Item, *ratelimit.Hold, ratelimit.Policy, ratelimit.SettleResult]()
