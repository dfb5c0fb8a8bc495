package main

import (
	"context"
	"time"

	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/ratelimit"
)

// memoryShare adapts a ratelimit memory-store token bucket to
// globalceiling.LocalLimiter: the guard's degraded mode. (globalceiling
// does not import ratelimit; a program that has both wires them here.
// globalceiling.NewLocalBucket is the dependency-free alternative.)
type memoryShare struct{ lim *ratelimit.Limiter }

func newMemoryShare(perSecond int64) (globalceiling.LocalLimiter, error) {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(), ratelimit.Policy{
		Algorithm: ratelimit.TokenBucket, Limit: perSecond, Period: time.Second,
	})
	if err != nil {
		return nil, err
	}
	return memoryShare{lim}, nil
}

// Allow decides on the memory store's own clock; now is not used.
func (m memoryShare) Allow(_ time.Time, cost int64) (bool, time.Duration) {
	d, err := m.lim.AllowN(context.Background(), "db", cost)
	if err != nil {
		return false, 0
	}
	return d.Allowed, d.RetryAfter
}
