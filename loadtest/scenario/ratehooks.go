package scenario

import (
	"github.com/spillway-go/spillway/internal/ratecore"
	"github.com/spillway-go/spillway/ratelimit"
)

// rateHooks are ratelimit's functions for its siblings.
var rateHooks = ratecore.Get[ratelimit.Item, *ratelimit.Hold, ratelimit.Policy, ratelimit.SettleResult]()
