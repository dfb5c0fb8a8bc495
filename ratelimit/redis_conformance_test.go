package ratelimit

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The conformance suite runs against a RedisStore on a real redis-server of
// its own, with the suite's clock passed through WithClock.
func init() {
	storeFactories = append(storeFactories, storeFactory{
		name: "redis",
		new: func(t *testing.T, now func() time.Time) Store {
			srv := redistest.Start(t)
			return NewRedisStore(srv.Client(t), WithClock(now))
		},
	})
}
