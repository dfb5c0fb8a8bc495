package spillway_test

import (
	"context"
	"fmt"
	"github.com/redis/go-redis/v9"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
	"github.com/spillway-go/spillway/shedder"
)

// TestHostileChain runs the hostile-input suite on a chain of a Redis
// rate limit (10 per hour per user), a Redis concurrency limit (20 units)
// and a worker shedder (30 units): the rate limit, the smallest, decides
// what can ever be admitted, and a denial anywhere leaves Redis and the
// worker's count as they were.
func TestHostileChain(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	now := func() time.Time { return time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC) }
	var (
		chain  spillway.Limiter
		worker *shedder.Worker
	)
	reset := func(ctx context.Context) error {
		if err := hostiletest.RedisDelete(ctx, rdb, "hostile:*"); err != nil {
			return err
		}
		rl, err := ratelimit.New(mustRedisStore(rdb, ratelimit.RedisSettings{Clock: now, Prefix: "hostile:"}), ratelimit.Policy{Limit: 10, Period: time.Hour}, ratelimit.Settings{Scope: "rate"})
		if err != nil {
			return err
		}
		cs, err := concurrency.NewRedisStore(rdb, concurrency.RedisSettings{Clock: now, Prefix: "hostile:"})
		if err != nil {
			return err
		}
		cl, err := concurrency.New(cs, 20, concurrency.Settings{})
		if err != nil {
			return err
		}
		if worker, err = shedder.NewWorker(30, shedder.WorkerSettings{Clock: now}); err != nil {
			return err
		}
		chain = spillway.Chain(ratelimit.PerKey(rl, spillway.DimUser), concurrency.PerKey(cl, spillway.DimUser), worker)
		return nil
	}
	hostiletest.Run(t, hostiletest.Subject{
		Capacity:  10,
		Batch:     1,
		ZeroIsOne: true,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			r := &spillway.Request{Priority: spillway.Critical, Cost: costs[0]}
			r.Set(spillway.DimUser, "ann")
			d, _, err := chain.Admit(ctx, r)
			return d.Allowed, []spillway.Decision{d}, err
		},
		State: func(ctx context.Context) (string, error) {
			st, err := hostiletest.RedisState(ctx, rdb, "hostile:*")
			return fmt.Sprint(st, " worker ", worker.Stats().InFlight), err
		},
		Reset: reset,
	})
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
