package ratelimit

import (
	"testing"
	"time"

	"github.com/spillway-go/spillway/internal/redistest"
)

// The conformance suite runs against a RedisStore on a real redis-server of
// its own, with the suite's clock passed as its Clock. The client
// removes the TTL of every key its scripts touch, in the same transaction
// (freezeHook): the suite's clock stands still or jumps while Redis
// expires keys in real time, and on a loaded machine a key with a TTL of a
// few milliseconds could expire between two steps at the same instant.
// TTLs are tested by TestRedisStoreTTLOnEveryKey and the differential test.
func init() {
	storeFactories = append(storeFactories, storeFactory{
		name: "redis",
		new: func(t *testing.T, now func() time.Time) Store {
			srv := redistest.Start(t)
			c := srv.Client(t)
			c.AddHook(&freezeHook{raw: srv.Client(t)})
			return mustRedisStore(c, RedisSettings{Clock: now})
		},
	})
}
