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
