package ratelimit

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The hold suite runs against a RedisStore on a real redis-server of its
// own, with the suite's clock (its Clock) and the conformance suite's
// freezeHook (the fake clock stands still while Redis expires keys in real
// time).
func init() {
	holdFactories = append(holdFactories, storeFactory{
		name: "redis",
		new: func(t *testing.T, now func() time.Time) Store {
			srv := redistest.Start(t)
			c := srv.Client(t)
			c.AddHook(&freezeHook{raw: srv.Client(t)})
			return mustRedisStore(c, RedisSettings{Clock: now})
		},
	})
}
