package tiers

import (
	"context"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/tiersview"

	"github.com/spillway-go/spillway/internal/ratecore"
	"github.com/spillway-go/spillway/ratelimit"
)

// rateHooks are ratelimit's functions for its siblings (hold plumbing and
// policy arithmetic that ratelimit keeps off its exported surface).
var rateHooks = ratecore.Get[ratelimit.Item, *ratelimit.Hold, ratelimit.Policy, ratelimit.SettleResult]()

// reserver is a store that can hold estimates (ratelimit.MemoryStore,
// ratelimit.RedisStore, fallback.Store).
type reserver interface {
	ratelimit.Store
	Reserve(ctx context.Context, items []ratelimit.Item, ttl time.Duration) (*ratelimit.Hold, error)
}

func init() {
	tiersview.Items = func(ctx context.Context, lim any, r *spillway.Request) ([]ratelimit.Item, error) {
		ms, err := lim.(*Limiter).matches(ctx, r)
		items := make([]ratelimit.Item, len(ms))
		for i := range ms {
			items[i] = ms[i].Item
		}
		return items, err
	}
}
