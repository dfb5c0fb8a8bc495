package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/contracttest"
	"github.com/spillway-go/spillway/ratelimit"
)

// The per-dimension adapter conforms over both stores: a rate limit holds
// nothing, denies once its quota is spent, and over a Redis that is gone
// returns an error with the zero Decision.
func TestPerKeyContract(t *testing.T) {
	policy := ratelimit.Policy{Limit: 1000, Period: time.Hour}
	instance := func(t *testing.T, store ratelimit.Store, brk func(*testing.T)) contracttest.Instance {
		lim, err := ratelimit.New(store, policy, ratelimit.Settings{Scope: "contract"})
		if err != nil {
			t.Fatal(err)
		}
		return contracttest.Instance{
			Limiter: ratelimit.PerKey(lim, spillway.DimUser),
			Deny: func(t *testing.T) {
				if _, _, err := ratelimit.PerKey(lim, spillway.DimUser).Admit(context.Background(), &spillway.Request{Cost: 1000, Dims: []spillway.Dimension{{Name: spillway.DimUser, Value: "u-contract"}}}); err != nil {
					t.Fatal(err)
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
			store, err := ratelimit.NewRedisStore(c, ratelimit.RedisSettings{})
			if err != nil {
				t.Fatal(err)
			}
			return instance(t, store, brk)
		}})
	})
}
