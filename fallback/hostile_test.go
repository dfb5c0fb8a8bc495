package fallback_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// recStore is a memory store that remembers every item it was asked
// about, so its state can be read back by peeks (cost 0 writes nothing).
type recStore struct {
	*ratelimit.MemoryStore
	seen []ratelimit.Item
}

func (p *recStore) Decide(ctx context.Context, items []ratelimit.Item, out []spillway.Decision) (bool, error) {
	for _, it := range items {
		it.Cost = 0
		if !slices.Contains(p.seen, it) {
			p.seen = append(p.seen, it)
		}
	}
	return p.MemoryStore.Decide(ctx, items, out)
}

func (p *recStore) state(ctx context.Context) (string, error) {
	out := make([]spillway.Decision, len(p.seen))
	if _, err := p.MemoryStore.Decide(ctx, p.seen, out); err != nil {
		return "", err
	}
	return fmt.Sprintf("%v %+v", p.seen, out), nil
}

// TestHostileStore runs the hostile-input suite on the fallback Store:
// healthy over a Redis node (the state is Redis's, byte for byte) and
// degraded with Redis down, where its local share (20% of 10: 2) decides
// and a cost from 3 to 10 is rate limited, not CostExceedsLimit (the full
// limit takes it once Redis is back).
func TestHostileStore(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC) }
	p := ratelimit.Policy{Limit: 10, Period: time.Hour}
	down := redistest.Start(t)
	downClient := redis.NewClient(&redis.Options{Addr: down.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { downClient.Close() })
	down.Stop()
	for _, c := range []struct {
		name     string
		client   redis.UniversalClient
		capacity int64
	}{{"healthy", redistest.Start(t).Client(t), 10}, {"degraded", downClient, 2}} {
		t.Run(c.name, func(t *testing.T) {
			var st *fallback.Store
			var local *recStore
			hostiletest.Run(t, hostiletest.Subject{
				Capacity: c.capacity,
				Limit:    p.Capacity(), // degraded, a cost the full limit can take is not called exceeding
				Batch:    3,
				Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
					items := make([]ratelimit.Item, len(costs))
					for i, n := range costs {
						items[i] = ratelimit.Item{Scope: "s", Key: "k", Policy: p, Cost: n}
					}
					out := make([]spillway.Decision, len(items))
					ok, err := st.Decide(ctx, items, out)
					return ok, out, err
				},
				State: func(ctx context.Context) (string, error) {
					if c.name == "degraded" {
						return local.state(ctx)
					}
					return hostiletest.RedisState(ctx, c.client, "hostile:*")
				},
				Reset: func(ctx context.Context) error {
					if c.name == "healthy" {
						if err := hostiletest.RedisDelete(ctx, c.client, "hostile:*"); err != nil {
							return err
						}
					}
					local = &recStore{MemoryStore: ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: now})}
					var err error
					st, err = fallback.NewStore(mustRedisStore(c.client, ratelimit.RedisSettings{Clock: now, Prefix: "hostile:"}),
						fallback.Settings{Local: local, Clock: now, Budget: time.Second})
					return err
				},
			})
		})
	}
}

// TestHostileLimiter runs the hostile-input suite on the fallback Limiter
// around a rate limiter of 10 per hour: healthy over a Redis node (the
// state is Redis's), and degraded with Redis down, where its local limiter
// (2 per hour) decides. Degraded, a cost above the local share is refused
// for now (fail closed with a RetryAfter): the wrapper cannot know the
// inner limit, so no cost counts as exceeding it.
func TestHostileLimiter(t *testing.T) {
	now := func() time.Time { return time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC) }
	down := redistest.Start(t)
	downClient := redis.NewClient(&redis.Options{Addr: down.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { downClient.Close() })
	down.Stop()
	for _, c := range []struct {
		name            string
		client          redis.UniversalClient
		capacity, limit int64
	}{{"healthy", redistest.Start(t).Client(t), 10, 10}, {"degraded", downClient, 2, hostiletest.MaxInt64}} {
		t.Run(c.name, func(t *testing.T) {
			var (
				l     *fallback.Limiter
				local *recStore
			)
			hostiletest.Run(t, hostiletest.Subject{
				Capacity:  c.capacity,
				Limit:     c.limit,
				Batch:     1,
				ZeroIsOne: true,
				Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
					r := &spillway.Request{Endpoint: "/x", Cost: costs[0]}
					r.Set(spillway.DimAPIKey, "k1")
					d, _, err := l.Admit(ctx, r)
					if err == nil && d.Degraded != (c.name == "degraded") {
						return false, nil, fmt.Errorf("cost %d: degraded %v in the %s case: %+v", costs[0], d.Degraded, c.name, d)
					}
					if err == nil && d.Degraded && !d.Allowed && d.RetryAfter <= 0 {
						return false, nil, fmt.Errorf("cost %d: refused with no RetryAfter: %+v", costs[0], d)
					}
					return d.Allowed, []spillway.Decision{d}, err
				},
				State: func(ctx context.Context) (string, error) {
					if c.name == "degraded" {
						return local.state(ctx)
					}
					return hostiletest.RedisState(ctx, c.client, "hostile-lim:*")
				},
				Reset: func(ctx context.Context) error {
					if c.name == "healthy" {
						if err := hostiletest.RedisDelete(ctx, c.client, "hostile-lim:*"); err != nil {
							return err
						}
					}
					inner, err := ratelimit.New(mustRedisStore(c.client, ratelimit.RedisSettings{Clock: now, Prefix: "hostile-lim:"}), ratelimit.Policy{Limit: 10, Period: time.Hour}, ratelimit.Settings{})
					if err != nil {
						return err
					}
					local = &recStore{MemoryStore: ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: now})}
					loc, err := ratelimit.New(local, ratelimit.Policy{Limit: 2, Period: time.Hour}, ratelimit.Settings{})
					if err != nil {
						return err
					}
					l, err = fallback.NewLimiter(ratelimit.PerKey(inner, spillway.DimAPIKey), ratelimit.PerKey(loc, spillway.DimAPIKey),
						fallback.Settings{Name: "lim", Clock: now, Budget: time.Second, OpenTimeout: 3 * time.Second})
					return err
				},
			})
		})
	}
}
