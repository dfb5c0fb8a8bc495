package tiers_test

import (
	"context"
	"github.com/redis/go-redis/v9"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/contracttest"
	"github.com/spillway-go/spillway/internal/tierstest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/tiers"
)

// A tiers Limiter conforms over both stores: several rules in one batch,
// a denial when one is spent, an error (a *spillway.StoreError) with the
// zero Decision when Redis is gone.
func TestLimiterContract(t *testing.T) {
	const yml = `
limits:
  - id: per-user
    by: user
    bucket: 1000/hour
  - id: per-ip
    by: ip
    bucket: 2000/hour
    fail: closed
`
	instance := func(t *testing.T, store ratelimit.Store, brk func(*testing.T)) contracttest.Instance {
		lim := newLimiter(t, yml, store)
		return contracttest.Instance{
			Limiter: lim,
			Deny: func(t *testing.T) {
				r := contracttest.Request()
				r.Cost = 1000
				if d, _, err := lim.Admit(context.Background(), r); err != nil || !d.Allowed {
					t.Fatalf("spending the user's quota: %+v, %v", d, err)
				}
			},
			Break: brk,
		}
	}
	t.Run("memory", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			return instance(t, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), nil)
		}})
	})
	t.Run("redis", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			c, brk := contracttest.Redis(t)
			return instance(t, mustRedisStore(c), brk)
		}})
	})
}

// The same with a "cost: response" rule in the batch: the hold is made
// with the other rule in one Reserve, done settles it once, a denial
// holds nothing, a dead Redis is a StoreError.
func TestLimiterContractResponseCost(t *testing.T) {
	const yml = `
limits:
  - id: tokens
    by: api_key
    bucket: 1000/hour
    cost: response
    estimate: 10
  - id: per-ip
    by: ip
    bucket: 2000/hour
    fail: closed
`
	instance := func(t *testing.T, store ratelimit.Store, brk func(*testing.T)) contracttest.Instance {
		lim := newLimiter(t, yml, store)
		return contracttest.Instance{
			Limiter: lim,
			Deny: func(t *testing.T) {
				r := contracttest.Request()
				r.Usage = new(spillway.Usage)
				d, done, err := lim.Admit(context.Background(), r)
				if err != nil || !d.Allowed {
					t.Fatalf("spending the key's tokens: %+v, %v", d, err)
				}
				_ = r.Usage.Set(1000)
				done(spillway.Success)
			},
			Break: brk,
		}
	}
	t.Run("memory", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			return instance(t, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), nil)
		}})
	})
	t.Run("redis", func(t *testing.T) {
		contracttest.Run(t, contracttest.Subject{New: func(t *testing.T) contracttest.Instance {
			c, brk := contracttest.Redis(t)
			return instance(t, mustRedisStore(c), brk)
		}})
	})
}

var _ spillway.Limiter = (*tiers.Limiter)(nil)

// newLimiter is a Limiter over store from the YAML config yml.
func newLimiter(t *testing.T, yml string, store ratelimit.Store) *tiers.Limiter {
	return tierstest.Limiter(t, yml, store)
}

// mustRedisStore is ratelimit.NewRedisStore for a client and settings that
// are valid.
func mustRedisStore(c redis.UniversalClient, set ...ratelimit.RedisSettings) *ratelimit.RedisStore {
	s, err := ratelimit.NewRedisStore(c, append(set, ratelimit.RedisSettings{})[0])
	if err != nil {
		panic(err)
	}
	return s
}
