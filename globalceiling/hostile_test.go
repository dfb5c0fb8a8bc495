package globalceiling

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
)

// ceilingSubject describes a ceiling of limit 10 per hour in mode m on
// client, admitted through Admit (Request.Cost: 0 is 1), or through a
// Guard around it; its state is every shard key plus the ceiling's local
// counts.
func ceilingSubject(t *testing.T, client redis.UniversalClient, m Mode, guard bool) hostiletest.Subject {
	clock := newFakeClock()
	var c *Ceiling
	var lim spillway.Limiter
	prefix := fmt.Sprintf("hostile-%s:", m)
	reset := func(ctx context.Context) error {
		if c != nil {
			c.Close()
		}
		if err := hostiletest.RedisDelete(ctx, client, prefix+"*"); err != nil {
			return err
		}
		var err error
		c, err = New(client, "db", 10, time.Hour, Settings{Mode: m, Clock: clock.Now, manualSync: true, Prefix: prefix, Shards: 3})
		lim = c
		if err == nil && guard {
			lim, err = NewGuard(c)
		}
		return err
	}
	t.Cleanup(func() {
		if c != nil {
			c.Close()
		}
	})
	return hostiletest.Subject{
		Capacity:  10,
		Batch:     1,
		ZeroIsOne: true,
		Exceeds:   spillway.ReasonCostExceedsLimit,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			d, _, err := lim.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: costs[0]})
			return d.Allowed, []spillway.Decision{d}, err
		},
		State: func(ctx context.Context) (string, error) {
			st, err := hostiletest.RedisState(ctx, client, prefix+"*")
			c.mu.Lock()
			defer c.mu.Unlock()
			return fmt.Sprintf("%s cur %+v prev %+v", st, c.cur, c.prev), err
		},
		Reset: reset,
	}
}

// TestHostileCeiling runs the hostile-input suite on every mode, on a
// Redis node and on a 3×3 Cluster, directly and through a Guard.
func TestHostileCeiling(t *testing.T) {
	clients := map[string]redis.UniversalClient{
		"redis":   redistest.Start(t).Client(t),
		"cluster": redistest.StartCluster(t).Client(t),
	}
	for cname, client := range clients {
		for _, m := range []Mode{Exact, Cached, LocalAggregation} {
			for _, guard := range []bool{false, true} {
				name := cname + "/" + m.String()
				if guard {
					name += "/guard"
				}
				t.Run(name, func(t *testing.T) { hostiletest.Run(t, ceilingSubject(t, client, m, guard)) })
			}
		}
	}
}

// TestHostileGuardDegraded runs the hostile-input suite on a Guard whose
// ceiling (10 per hour) cannot reach its Redis, so it decides at its local share (0.2 of
// 10 = 2 per hour): nothing above 2 is admitted, a cost the full ceiling
// could take (3 to 10) is refused for now with a RetryAfter, a cost above
// 10 is denied as exceeding, as the store would, and no denial touches
// the local bucket. (Exact mode: the Cached and LocalAggregation modes
// decide from their own counts between syncs, without asking Redis.)
func TestHostileGuardDegraded(t *testing.T) {
	for _, m := range []Mode{Exact} {
		t.Run(m.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
			t.Cleanup(func() { client.Close() })
			srv.Stop()
			clock := newFakeClock()
			var (
				c     *Ceiling
				guard *Guard
			)
			t.Cleanup(func() {
				if c != nil {
					c.Close()
				}
			})
			hostiletest.Run(t, hostiletest.Subject{
				Capacity:  2,
				Limit:     10,
				Batch:     1,
				ZeroIsOne: true,
				Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
					d, _, err := guard.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: costs[0]})
					if err == nil && !d.Allowed && d.Reason == spillway.ReasonCeiling && d.RetryAfter <= 0 {
						return false, nil, fmt.Errorf("cost %d: refused with no RetryAfter: %+v", costs[0], d)
					}
					if err == nil && !d.Degraded {
						return false, nil, fmt.Errorf("cost %d: not degraded: %+v", costs[0], d)
					}
					return d.Allowed, []spillway.Decision{d}, err
				},
				State: func(ctx context.Context) (string, error) {
					c.lw.mu.Lock()
					defer c.lw.mu.Unlock()
					return fmt.Sprintf("window %d: %d", c.lw.w, c.lw.count), nil
				},
				Reset: func(ctx context.Context) error {
					if c != nil {
						c.Close()
					}
					var err error
					if c, err = New(client, "db", 10, time.Hour, Settings{Mode: m, Clock: clock.Now, manualSync: true, Shards: 3}); err != nil {
						return err
					}
					guard, err = NewGuard(c)
					return err
				},
			})
		})
	}
}
