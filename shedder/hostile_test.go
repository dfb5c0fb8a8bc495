package shedder

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

var fixedNow = testclock.New(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)).Now

// limiterSubject describes lim (made anew by mk) admitting requests of
// priority p; admissions are never released, so their costs add up.
func limiterSubject(capacity int64, p spillway.Priority, mk func() (spillway.Limiter, func() string)) hostiletest.Subject {
	var lim spillway.Limiter
	var state func() string
	return hostiletest.Subject{
		Capacity:  capacity,
		Batch:     1,
		ZeroIsOne: true,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			d, _, err := lim.Admit(ctx, &spillway.Request{Priority: p, Cost: costs[0]})
			return d.Allowed, []spillway.Decision{d}, err
		},
		State: func(context.Context) (string, error) { return state(), nil },
		Reset: func(context.Context) error { lim, state = mk(); return nil },
	}
}

// TestHostileWorker: a Worker of capacity 10 admits Critical work up to
// 10 units and CriticalPlus work without a cap — up to MaxInt64 units in
// flight, never wrapping past it (one MaxInt64 request on top of one unit
// used to wrap the count negative and switch the limit off).
func TestHostileWorker(t *testing.T) {
	for _, c := range []struct {
		p   spillway.Priority
		cap int64
	}{{spillway.Critical, 10}, {spillway.CriticalPlus, math.MaxInt64}} {
		t.Run(c.p.String(), func(t *testing.T) {
			hostiletest.Run(t, limiterSubject(c.cap, c.p, func() (spillway.Limiter, func() string) {
				w, err := NewWorker(10, WorkerSettings{Clock: fixedNow})
				if err != nil {
					t.Fatal(err)
				}
				return w, func() string { return fmt.Sprint(w.InFlight()) }
			}))
		})
	}
}

// TestHostileQueue: a Queue of 10 slots (no waiting) admits at most 10
// units, whatever the costs.
func TestHostileQueue(t *testing.T) {
	hostiletest.Run(t, limiterSubject(10, spillway.Critical, func() (spillway.Limiter, func() string) {
		q, err := NewQueue(10, QueueSettings{Clock: fixedNow})
		if err != nil {
			t.Fatal(err)
		}
		return q, func() string { q.mu.Lock(); defer q.mu.Unlock(); return fmt.Sprint(q.used) }
	}))
}

// TestHostileFleet: a Fleet of capacity 100, refreshed once (one server),
// on a Redis node and a 3×3 Cluster: Critical work up to its threshold,
// CriticalPlus up to MaxFleetCapacity, the reports in Redis untouched by
// denials.
func TestHostileFleet(t *testing.T) {
	clients := map[string]redis.UniversalClient{
		"redis":   redistest.Start(t).Client(t),
		"cluster": redistest.StartCluster(t).Client(t),
	}
	if _, err := NewFleet(clients["redis"], "x", MaxFleetCapacity+1, FleetSettings{}); err == nil {
		t.Fatal("NewFleet accepted a capacity above MaxFleetCapacity")
	}
	for name, client := range clients {
		for _, p := range []spillway.Priority{spillway.Critical, spillway.CriticalPlus} {
			t.Run(name+"/"+p.String(), func(t *testing.T) {
				var full int64
				mk := func() (spillway.Limiter, func() string) {
					ctx := context.Background()
					if err := hostiletest.RedisDelete(ctx, client, "hostile:*"); err != nil {
						t.Fatal(err)
					}
					f, err := NewFleet(client, "db", 100, FleetSettings{Clock: fixedNow, Prefix: "hostile:", ServerID: "s1"}.With(Knobs{NoAutoRefresh: true, StaleAfter: time.Hour}))
					if err != nil {
						t.Fatal(err)
					}
					if err := f.Refresh(ctx); err != nil {
						t.Fatal(err)
					}
					full = f.fullLimit(p)
					return f, func() string {
						st, err := hostiletest.RedisState(ctx, client, "hostile:*")
						if err != nil {
							t.Fatal(err)
						}
						return fmt.Sprint(st, f.localTotal.Load(), f.local[p].Load())
					}
				}
				mk()
				if p == spillway.CriticalPlus && full != MaxFleetCapacity {
					t.Fatalf("CriticalPlus full limit %d, want MaxFleetCapacity", full)
				}
				hostiletest.Run(t, limiterSubject(full, p, mk))
			})
		}
	}
}
