package globalceiling

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway/internal/redistest"
)

// commandCalls returns the calls of cmd on s from INFO commandstats.
func commandCalls(t *testing.T, s *redistest.Server, cmd string) int64 {
	t.Helper()
	v, err := s.Do(context.Background(), "INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	return int64(redistest.CommandStats(v.(string))[cmd].Calls)
}

// TestClusterThreeServersSpreadAndBound: three servers with their own
// Cluster clients share a ceiling of 600 with K = 8 on a 3-primary Cluster.
// The admitted total stays within the stated Cluster bound (at most the
// admissions in flight when the ceiling is crossed: here 30), the counters
// hold exactly what was admitted, and each primary runs the share of the
// charges (EVALSHA in INFO commandstats) that its shard keys predict.
func TestClusterThreeServersSpreadAndBound(t *testing.T) {
	cl := redistest.StartCluster(t)
	ctx := context.Background()
	clock := newFakeClock()
	var cs []*Ceiling
	for i := 0; i < 3; i++ {
		c, err := New(cl.Client(t), "orders-db", 600, time.Minute, Settings{Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	primaries, err := cl.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := cs[0].windowOf(clock.Now())
	shardsOn := map[*redistest.Server]int{}
	for j := 0; j < 8; j++ {
		owner, err := cl.OwnerOfKey(ctx, cs[0].key(w, j))
		if err != nil {
			t.Fatal(err)
		}
		shardsOn[owner]++
	}
	if len(shardsOn) < 2 {
		t.Fatalf("8 shard keys landed on %d node(s)", len(shardsOn))
	}
	for _, p := range primaries {
		if _, err := p.Do(ctx, "CONFIG", "RESETSTAT"); err != nil {
			t.Fatal(err)
		}
	}

	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, c := range cs {
		for g := 0; g < 10; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 30; i++ {
					d, _, err := c.Admit(ctx, critical())
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("admitted %d of 900 attempts", admitted.Load())
	if n := admitted.Load(); n < 570 || n > 630 {
		t.Fatalf("admitted %d, want 600 within the Cluster bound of 30 in flight", n)
	}
	var sum int64
	for j := 0; j < 8; j++ {
		n, err := cs[0].client.Get(ctx, cs[0].key(w, j)).Int64()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		sum += n
	}
	if sum != admitted.Load() {
		t.Fatalf("shards hold %d, admitted %d", sum, admitted.Load())
	}
	var total int64
	calls := map[*redistest.Server]int64{}
	for _, p := range primaries {
		calls[p] = commandCalls(t, p, "evalsha")
		total += calls[p]
	}
	for _, p := range primaries {
		want := float64(shardsOn[p]) / 8
		got := float64(calls[p]) / float64(total)
		t.Logf("primary %s: %d of 8 shards, %d EVALSHA (%.2f of all, expected %.2f), %d GET",
			p.Addr, shardsOn[p], calls[p], got, want, commandCalls(t, p, "get"))
		if math.Abs(got-want) > 0.1 {
			t.Fatalf("primary %s runs %.2f of the charges, expected %.2f from its shards", p.Addr, got, want)
		}
	}
}
