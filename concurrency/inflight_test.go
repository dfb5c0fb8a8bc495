package concurrency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/globalceiling"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/redistest"
)

// burst runs 30 database calls at once through guard, each holding its
// admission for hold, and returns the most in flight at the database at
// once, how many ran, and how many of the admissions were Degraded.
func burst(t *testing.T, guard *globalceiling.Guard, hold time.Duration) (maxInFlight, ran, degraded int64) {
	t.Helper()
	var inFlight, most, n, deg atomic.Int64
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, done, err := guard.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
			if err != nil {
				t.Errorf("admit: %v", err)
				return
			}
			if !d.Allowed {
				if d.Reason != spillway.ReasonCeiling || d.Limiter != "db_inflight" {
					t.Errorf("denial %+v: want ReasonCeiling naming db_inflight", d)
				}
				return
			}
			if d.Degraded {
				deg.Add(1)
			}
			v := inFlight.Add(1)
			for {
				m := most.Load()
				if v <= m || most.CompareAndSwap(m, v) {
					break
				}
			}
			time.Sleep(hold) // the database call
			inFlight.Add(-1)
			n.Add(1)
			done(spillway.Success)
		}()
	}
	wg.Wait()
	return most.Load(), n.Load(), deg.Load()
}

// "At most 5 database calls in flight across the fleet" holds under a
// 30-request burst with Redis healthy and with Redis slowed past the
// budget (calls then decided locally, at the share of a fleet of unknown
// size: 0.2 of 5 = 1), and a denial names the cap.
func TestInFlightCapHoldsUnderBursts(t *testing.T) {
	srv := redistest.Start(t)
	p, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	client := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, PoolSize: 64})
	t.Cleanup(func() { client.Close() })
	capN := int64(5)
	cap5, err := concurrency.NewInFlight(client, capN, concurrency.Settings{Name: "db_inflight"})
	if err != nil {
		t.Fatal(err)
	}
	guard, err := globalceiling.NewGuard(cap5)
	if err != nil {
		t.Fatal(err)
	}
	most, ran, deg := burst(t, guard, 30*time.Millisecond)
	t.Logf("healthy: at most %d in flight, %d ran, %d degraded", most, ran, deg)
	if most > capN || ran < 1 {
		t.Fatalf("Redis healthy: %d in flight at once (%d ran), want at most %d", most, ran, capN)
	}
	// Redis answers 40 ms late each way: past the 50 ms budget.
	p.SetLatency(40*time.Millisecond, 40*time.Millisecond)
	most, ran, deg = burst(t, guard, 30*time.Millisecond)
	t.Logf("slow Redis: at most %d in flight, %d ran, %d degraded", most, ran, deg)
	if most > capN || ran < 1 || deg < 1 {
		t.Fatalf("Redis slowed: %d in flight at once (%d ran, %d degraded), want at most %d and local decisions", most, ran, deg, capN)
	}
	// A denial through Do names the cap.
	fill := make([]spillway.Done, 0, capN)
	p.SetLatency(0, 0)
	// Fill the cap in Redis: on a loaded machine a call can still run out
	// of its budget and be decided locally, so count Redis's grants only.
	for held, tries := int64(0), 0; held < capN; tries++ {
		d, done, err := cap5.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
		switch {
		case err == nil && d.Allowed:
			fill = append(fill, done)
			if !d.Degraded {
				held++
			}
		case tries > 200:
			t.Fatalf("could not fill the cap: %d held in Redis after %d tries", held, tries)
		default:
			time.Sleep(10 * time.Millisecond) // a release of the bursts still on its way
		}
	}
	err = guard.Do(context.Background(), nil, func(context.Context) error { return nil })
	var rej *globalceiling.RejectedError
	if !errors.As(err, &rej) || err.Error() != `globalceiling: "db_inflight" denied (ceiling); retry after 1s` {
		t.Fatalf("Do with the cap full: %v", err)
	}
	for _, done := range fill {
		done(spillway.Success)
	}
}

// A guard over a chain never skips a block while Redis is down: each
// block decides locally by itself, so the in-flight cap still holds (at
// its share: 0.2 of 10 = 2 while no fleet shedder has counted) behind a
// ceiling that still admits.
func TestGuardKeepsEveryBlockWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	inflight, err := concurrency.NewInFlight(client, 10, concurrency.Settings{Name: "db_inflight"})
	if err != nil {
		t.Fatal(err)
	}
	ceil, err := globalceiling.New(client, "db_rate", 1000, time.Hour, globalceiling.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ceil.Close() })
	guard, err := globalceiling.NewGuard(spillway.Chain(ceil, inflight))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	ctx := context.Background()
	var dones []spillway.Done
	for i := 0; i < 2; i++ {
		d, done, err := guard.Admit(ctx, &spillway.Request{Priority: spillway.Critical})
		if err != nil || !d.Allowed || !d.Degraded {
			t.Fatalf("admission %d with Redis down: %+v %v", i, d, err)
		}
		dones = append(dones, done)
	}
	d, _, err := guard.Admit(ctx, &spillway.Request{Priority: spillway.Critical})
	if err != nil || d.Allowed || !d.Degraded || d.Limiter != "db_inflight" || d.Reason != spillway.ReasonCeiling || d.Limit != 2 {
		t.Fatalf("third in flight with Redis down: %+v %v; want the in-flight cap's local denial", d, err)
	}
	dones[0](spillway.Success)
	if d, done, err := guard.Admit(ctx, &spillway.Request{Priority: spillway.Critical}); err != nil || !d.Allowed {
		t.Fatalf("after one done: %+v %v", d, err)
	} else {
		done(spillway.Success)
	}
	dones[1](spillway.Success)
}
