package concurrency

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/internal/testclock"
)

// memStoreState is an image of every in-flight set of a memory store.
func memStoreState(s *MemoryStore) string {
	var lines []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, set := range sh.sets {
			for id, start := range set.m {
				lines = append(lines, fmt.Sprintf("%q %s %d %d", k, id, start, set.costOf(id)))
			}
			if len(set.m) == 0 {
				lines = append(lines, fmt.Sprintf("%q empty", k))
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

var hostileNow = testclock.New(time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)).Now

// limiterSubject describes a Limiter of 10 units over the store mk makes,
// admitted through PerKey (Request.Cost: 0 is 1); admissions are never
// released, so the units add up as the suite counts them.
func limiterSubject(mk func() (Store, func() (string, error))) hostiletest.Subject {
	var lim spillway.Limiter
	var state func() (string, error)
	reset := func(context.Context) error {
		st, stateOf := mk()
		l, err := New(st, 10, Settings{Name: "hostile"})
		lim, state = PerKey(l, spillway.DimUser), stateOf
		return err
	}
	_ = reset(context.Background())
	return hostiletest.Subject{
		Capacity:  10,
		Batch:     1,
		ZeroIsOne: true,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			r := &spillway.Request{Priority: spillway.Critical, Cost: costs[0]}
			r.Set(spillway.DimUser, "u")
			d, _, err := lim.Admit(ctx, r)
			return d.Allowed, []spillway.Decision{d}, err
		},
		State: func(context.Context) (string, error) { return state() },
		Reset: reset,
	}
}

func memoryMaker() (Store, func() (string, error)) {
	s := NewMemoryStore(MemorySettings{Clock: hostileNow})
	return s, func() (string, error) { return memStoreState(s), nil }
}

func redisMaker(c redis.UniversalClient) func() (Store, func() (string, error)) {
	return func() (Store, func() (string, error)) {
		ctx := context.Background()
		_ = hostiletest.RedisDelete(ctx, c, "hostile:*")
		s, err := NewRedisStore(c, RedisSettings{Clock: hostileNow, Prefix: "hostile:"})
		if err != nil {
			panic(err)
		}
		return s, func() (string, error) { return hostiletest.RedisState(ctx, c, "hostile:*") }
	}
}

// TestHostileLimiter runs the hostile-input suite on the per-key limiter
// over the memory store, a Redis node and a 3×3 Cluster, and compares
// memory with Redis.
func TestHostileLimiter(t *testing.T) {
	node := redistest.Start(t).Client(t)
	cluster := redistest.StartCluster(t).Client(t)
	t.Run("memory", func(t *testing.T) { hostiletest.Run(t, limiterSubject(memoryMaker)) })
	for name, c := range map[string]redis.UniversalClient{"redis": node, "cluster": cluster} {
		t.Run(name, func(t *testing.T) { hostiletest.Run(t, limiterSubject(redisMaker(c))) })
		t.Run(name+"/differential", func(t *testing.T) {
			hostiletest.RunDifferential(t, limiterSubject(memoryMaker), limiterSubject(redisMaker(c)))
		})
	}
}

// TestHostileStoreDirect: the stores themselves refuse a cost outside
// [1, limit] with an error, before touching state; the Redis store
// refuses a limit above MaxRedisLimit, and New refuses it up front.
func TestHostileStoreDirect(t *testing.T) {
	node := redistest.Start(t).Client(t)
	ctx := context.Background()
	for name, mk := range map[string]func() (Store, func() (string, error)){"memory": memoryMaker, "redis": redisMaker(node)} {
		st, state := mk()
		if _, err := st.acquire(ctx, "s", "k", "warm", 1, 10, time.Minute); err != nil {
			t.Fatal(err)
		}
		before, _ := state()
		for _, c := range hostiletest.Costs(10) {
			if c >= 1 && c <= 10 {
				continue
			}
			if res, err := st.acquire(ctx, "s", "k", "x", c, 10, time.Minute); err == nil {
				t.Errorf("%s: cost %d of limit 10: %+v, want an error", name, c, res)
			}
			if err := st.release(ctx, "s", "k", "x", c); c < 1 && err == nil {
				t.Errorf("%s: release of cost %d: no error", name, c)
			}
		}
		if after, _ := state(); after != before {
			t.Errorf("%s: refused costs changed the state:\n%s\n%s", name, before, after)
		}
	}
	rs, _ := redisMaker(node)()
	if _, err := rs.acquire(ctx, "s", "k", "x", 1, MaxRedisLimit+1, time.Minute); err == nil || !strings.Contains(err.Error(), "MaxRedisLimit") && !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("limit MaxRedisLimit+1 on Redis: %v", err)
	}
	if err := rs.release(ctx, "s", "k", "x", hostiletest.MaxInt64); err == nil {
		t.Error("release of cost MaxInt64 on Redis: no error (it would allocate one string per unit)")
	}
	if _, err := New(rs, MaxRedisLimit+1, Settings{}); err == nil || !strings.Contains(err.Error(), "MaxRedisLimit") {
		t.Errorf("New over Redis with limit MaxRedisLimit+1: %v", err)
	}
	if _, err := New(NewMemoryStore(MemorySettings{}), hostiletest.MaxInt64, Settings{}); err != nil {
		t.Errorf("New over memory with limit MaxInt64: %v", err)
	}
}

// TestHostileAdaptive: an adaptive limit counts requests, not cost, so
// every hostile cost holds one slot: never more than the limit in flight,
// a negative cost is ReasonInvalid.
func TestHostileAdaptive(t *testing.T) {
	alg, err := NewAIMD(AIMDConfig{Initial: 5, Max: 5})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdaptive(alg, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admitted := 0
	for _, c := range hostiletest.Costs(5) {
		d, _, err := a.Admit(ctx, &spillway.Request{Priority: spillway.Critical, Cost: c})
		switch {
		case err != nil:
			t.Fatal(err)
		case c < 0:
			if d.Allowed || d.Reason != spillway.ReasonInvalid {
				t.Errorf("cost %d: %+v, want ReasonInvalid", c, d)
			}
		case d.Allowed:
			admitted++
		case d.Reason != spillway.ReasonShed:
			t.Errorf("cost %d: %+v", c, d)
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d requests of hostile costs, limit 5", admitted)
	}
}
