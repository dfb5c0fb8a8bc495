package main

import (
	"context"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// memoryShare stands in for the ceiling when there is no Redis at all: a
// ratelimit memory-store token bucket of this server's share, its
// decisions marked Degraded as the ceiling's own local decisions are.
type memoryShare struct{ lim *ratelimit.Limiter }

func newMemoryShare(perSecond int64) (spillway.Limiter, error) {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{
		Algorithm: ratelimit.TokenBucket, Limit: perSecond, Period: time.Second,
	}, ratelimit.Settings{})
	if err != nil {
		return nil, err
	}
	return memoryShare{lim}, nil
}

// Admit decides on the memory store's own clock.
func (m memoryShare) Admit(ctx context.Context, r *spillway.Request) (spillway.Decision, spillway.Done, error) {
	d, err := m.lim.Allow(ctx, "db", r.EffectiveCost())
	if err != nil {
		return spillway.Decision{}, spillway.Noop, err
	}
	d.Limiter, d.Degraded = "ceiling", true
	if !d.Allowed {
		d.Reason = spillway.ReasonCeiling
	}
	return d, spillway.Noop, nil
}
