package fallback_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/ratelimit"
)

// A caller starved in this process — its calls wait for the one pooled
// connection, held by another caller, until their budget is gone, before
// anything is written — is refused, undecided (an error that
// matches spillway.ErrBudgetSpent, no local decision), and the wait is
// reported as overload, never against Redis: the breaker stays closed.
func TestStarvedCallerIsOverloadNotARedisFailure(t *testing.T) {
	b := newBed(t)
	opt := *b.client.Options()
	opt.PoolSize = 1
	opt.PoolTimeout = 10 * time.Second // only the budget ends a wait for the pool
	client := redis.NewClient(&opt)
	t.Cleanup(func() { client.Close() })
	h, err := fallback.NewHealth(client, fallback.HealthSettings{Name: "starved"})
	if err != nil {
		t.Fatal(err)
	}
	var overload, other atomic.Int64
	st, err := fallback.NewStore(mustRedisStore(client, ratelimit.RedisSettings{Clock: b.clock.Now}), fallback.Settings{
		Health: h, Budget: 40 * time.Millisecond, Clock: b.clock.Now,
		OnDegraded: func(e fallback.DegradedEvent) {
			if errors.Is(e.Cause, spillway.ErrBudgetSpent) {
				overload.Add(1)
			} else {
				other.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded || d.Remaining != 99 {
		t.Fatalf("healthy decision = %+v; want from Redis, 99 left", d)
	}

	// Hold the only connection, idle: a caller of this process has it
	// (nothing outstanding on it, Redis answered everything).
	held := client.Conn()
	if err := held.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection held", func() bool { return client.PoolStats().IdleConns == 0 && client.PoolStats().TotalConns == 1 })

	const callers, rounds = 16, 3
	var wg sync.WaitGroup
	var degraded, refused atomic.Int64
	for range callers {
		wg.Go(func() {
			for range rounds {
				out := make([]spillway.Decision, 1)
				ok, err := st.Decide(context.Background(), []ratelimit.Item{{Scope: "api", Key: "k", Policy: hourly, Cost: 1}}, out)
				switch {
				case errors.Is(err, spillway.ErrBudgetSpent) && !ok && out[0] == (spillway.Decision{}):
					refused.Add(1)
				case err != nil:
					t.Errorf("Decide: %v, want an error matching ErrBudgetSpent", err)
					return
				case out[0].Degraded:
					degraded.Add(1)
				}
			}
		})
	}
	wg.Wait()

	// In a chain the refusal is the block's store error: its fail mode
	// answers (here closed), nothing is decided locally.
	lim, err := ratelimit.New(st, hourly, ratelimit.Settings{Scope: "chain", FailMode: spillway.FailClosed})
	if err != nil {
		t.Fatal(err)
	}
	r := &spillway.Request{}
	r.Set(spillway.DimIP, "198.51.100.9")
	d, _, err := spillway.Chain(ratelimit.PerKey(lim, spillway.DimIP)).Admit(context.Background(), r)
	var se *spillway.StoreError
	if !errors.As(err, &se) || se.Fail != spillway.FailClosed || !errors.Is(err, spillway.ErrBudgetSpent) || d.Degraded {
		t.Fatalf("chain on a starved caller: %+v, %v; want a *StoreError asking for FailClosed, matching ErrBudgetSpent", d, err)
	}
	if err := held.Close(); err != nil {
		t.Fatal(err)
	}
	hs, ss := h.Stats(), st.Stats()
	t.Logf("health %+v; store %+v", hs, ss)
	const n = callers * rounds
	if refused.Load() != n || degraded.Load() != 0 {
		t.Fatalf("%d refused, %d degraded of %d; want all refused, none decided locally", refused.Load(), degraded.Load(), n)
	}
	if hs.State != fallback.Closed || hs.Opened != 0 || hs.Failures != 0 || hs.ConsecutiveFailures != 0 {
		t.Fatalf("health after a starved caller: %+v; want closed, never opened, no failure", hs)
	}
	if hs.Overloaded < n+1 {
		t.Fatalf("health counted %d overloaded calls; want at least %d", hs.Overloaded, n)
	}
	if ss.Degraded != 0 || ss.Overloaded != n+1 || ss.Refused != n+1 || overload.Load() != 0 || other.Load() != 0 {
		t.Fatalf("store: %d degraded, %d overloaded, %d refused, events %d overload / %d other; want %d overloaded and refused, no local decision", ss.Degraded, ss.Overloaded, ss.Refused, overload.Load(), other.Load(), n+1)
	}
	// Redis was never the problem: the next call is its again.
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded || d.Remaining != 98 {
		t.Fatalf("after the hold: %+v; want from Redis, 98 left", d)
	}
}

// Redis itself slow (every reply delayed past the budget by the fault
// proxy): the calls fail on Redis's account and the breaker opens.
func TestDelayedRedisOpensTheBreaker(t *testing.T) {
	b := newBed(t)
	h, err := fallback.NewHealth(b.client, fallback.HealthSettings{Name: "slow", OpenTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st := b.fallback(t, fallback.Settings{Health: h, Budget: 40 * time.Millisecond})
	b.warm(t)
	if d := decide(t, st, "api", "k", hourly, 1); d.Degraded {
		t.Fatalf("healthy decision = %+v; want from Redis", d)
	}
	b.proxy.SetLatency(0, 120*time.Millisecond)
	for i := range 5 {
		if d := decide(t, st, "api", "k", hourly, 1); !d.Degraded {
			t.Fatalf("call %d with Redis delayed: %+v; want degraded", i, d)
		}
	}
	hs, ss := h.Stats(), st.Stats()
	if hs.State != fallback.Open || hs.Opened != 1 || hs.Failures != 5 || hs.Overloaded != 0 {
		t.Fatalf("health with Redis delayed: %+v; want open once after 5 failures, none overload", hs)
	}
	if ss.Degraded != 5 || ss.Overloaded != 0 {
		t.Fatalf("store: %+v; want 5 degraded, none overloaded", ss)
	}
}
