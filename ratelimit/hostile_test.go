package ratelimit

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/hostiletest"
	"github.com/spillway-go/spillway/internal/redistest"
)

// memState is an image of every entry of a memory store, sorted.
func memState(s *MemoryStore) string {
	var lines []string
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			for ; e != nil; e = e.next {
				l := fmt.Sprintf("%q %q %d full=%d %d %d %d", e.scope, e.key, e.layout, e.full, e.a, e.b, e.c)
				if e.log != nil {
					l += fmt.Sprint(" log=", e.log.ts[e.log.start:])
					if hs := e.log.holds; hs != nil {
						var live []string
						for _, u := range hs.live {
							live = append(live, fmt.Sprintf("%s:%d@%d", u.member, u.est, u.exp))
						}
						slices.Sort(live)
						l += fmt.Sprint(" marked=", hs.marked, " holds=", live)
					}
				}
				lines = append(lines, l)
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// hostilePolicies are the policies the suite runs: each algorithm at a
// small capacity, and the bucket family at the largest valid burst.
func hostilePolicies() map[string]Policy {
	return map[string]Policy{
		"token_bucket":           {Limit: 10, Period: time.Hour},
		"gcra_burst":             {Algorithm: GCRA, Limit: 5, Period: time.Hour, Burst: 12},
		"leaky_bucket":           {Algorithm: LeakyBucket, Limit: 7, Period: time.Minute},
		"fixed_window":           {Algorithm: FixedWindow, Limit: 10, Period: time.Hour},
		"sliding_window_counter": {Algorithm: SlidingWindowCounter, Limit: 10, Period: time.Hour},
		"sliding_window_log":     {Algorithm: SlidingWindowLog, Limit: 10, Period: time.Hour},
		"sliding_window_buckets": {Algorithm: SlidingWindowBuckets, Limit: 10, Period: time.Hour, Buckets: 6, Mode: Conservative},
		"token_bucket_edge":      {Limit: 1e6, Period: time.Second, Burst: MaxSpanMicros},
		"gcra_edge":              {Algorithm: GCRA, Limit: 3, Period: 10 * time.Microsecond, Burst: MaxSpanMicros / 4},
	}
}

// storeSubject describes store s (made by mk; Reset makes a new one or
// clears Redis) deciding costs as items of one (scope, key, p); with
// bystander, a batch of two or more also carries a fixed-window item of
// another key, so it takes the mixed-batch path.
func storeSubject(mk func() Store, state func(Store) (string, error), p Policy, bystander bool) hostiletest.Subject {
	st := mk()
	by := Item{Scope: "by", Key: "other", Policy: Policy{Algorithm: FixedWindow, Limit: 1000, Period: time.Hour}, Cost: 1}
	return hostiletest.Subject{
		Capacity: p.Capacity(),
		Warm:     warmOf(p),
		Batch:    3,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			items := make([]Item, 0, len(costs)+1)
			for _, c := range costs {
				items = append(items, Item{Scope: "s", Key: "k", Policy: p, Cost: c})
			}
			if bystander && len(costs) > 1 {
				items = append(items, by)
			}
			out := make([]spillway.Decision, len(items))
			ok, err := st.Decide(ctx, items, out)
			return ok, out[:len(costs)], err
		},
		State: func(context.Context) (string, error) { return state(st) },
		Reset: func(context.Context) error { st = mk(); return nil },
	}
}

// warmOf is a first charge whose state outlives the test on Redis's own
// clock (which runs the keys' TTLs): at least an hour's worth of units.
func warmOf(p Policy) int64 {
	return max(1, min(p.Capacity()/2, time.Hour.Microseconds()/p.emissionInterval()))
}

var hostileT0 = time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)

func memorySubject(p Policy, bystander bool) hostiletest.Subject {
	return storeSubject(func() Store { return NewMemoryStore(MemorySettings{Clock: func() time.Time { return hostileT0 }}) },
		func(s Store) (string, error) { return memState(s.(*MemoryStore)), nil }, p, bystander)
}

func redisSubject(c redis.UniversalClient, prefix string, p Policy, bystander bool) hostiletest.Subject {
	s := storeSubject(func() Store {
		return mustRedisStore(c, RedisSettings{Clock: func() time.Time { return hostileT0 }, Prefix: prefix})
	},
		func(Store) (string, error) { return hostiletest.RedisState(context.Background(), c, prefix+"*") }, p, bystander)
	s.Reset = func(ctx context.Context) error { return hostiletest.RedisDelete(ctx, c, prefix+"*") }
	return s
}

// TestHostileStores runs the hostile-input suite on the memory store, a
// Redis node and a 3×3 Cluster, for every algorithm and at the edge of
// the valid range, alone and in mixed batches, and checks memory and
// Redis decide alike.
func TestHostileStores(t *testing.T) {
	node := redistest.Start(t).Client(t)
	cluster := redistest.StartCluster(t).Client(t)
	for name, p := range hostilePolicies() {
		for _, mixed := range []bool{false, true} {
			n := name
			if mixed {
				n += "/mixed"
			}
			t.Run(n, func(t *testing.T) {
				mem := memorySubject(p, mixed)
				t.Run("memory", func(t *testing.T) { hostiletest.Run(t, mem) })
				for _, r := range []struct {
					name string
					c    redis.UniversalClient
				}{{"redis", node}, {"cluster", cluster}} {
					red := redisSubject(r.c, "hostile:", p, mixed)
					t.Run(r.name, func(t *testing.T) { hostiletest.Run(t, red) })
					t.Run(r.name+"/differential", func(t *testing.T) {
						hostiletest.RunDifferential(t, memorySubject(p, mixed), red)
					})
				}
			})
		}
	}
	// Reserve: hostile estimates are denied or rejected like costs, and a
	// denied reservation holds nothing.
	for name, p := range holdPolicies() {
		t.Run("reserve/"+name, func(t *testing.T) {
			memMk := func() Store { return NewMemoryStore(MemorySettings{Clock: func() time.Time { return hostileT0 }}) }
			memSt := func(s Store) (string, error) { return memState(s.(*MemoryStore)), nil }
			t.Run("memory", func(t *testing.T) { hostiletest.Run(t, reserveSubject(memMk, memSt, p)) })
			for _, r := range []struct {
				name string
				c    redis.UniversalClient
			}{{"redis", node}, {"cluster", cluster}} {
				const prefix = "hostile-hold:"
				mk := func() Store {
					return mustRedisStore(r.c, RedisSettings{Clock: func() time.Time { return hostileT0 }, Prefix: prefix})
				}
				red := reserveSubject(mk, func(Store) (string, error) { return hostiletest.RedisState(context.Background(), r.c, prefix+"*") }, p)
				red.Reset = func(ctx context.Context) error { return hostiletest.RedisDelete(ctx, r.c, prefix+"*") }
				t.Run(r.name, func(t *testing.T) { hostiletest.Run(t, red) })
				t.Run(r.name+"/differential", func(t *testing.T) {
					hostiletest.RunDifferential(t, reserveSubject(memMk, memSt, p), red)
				})
			}
		})
	}
}

// holdPolicies are the policies the suite reserves on: the bucket family
// at a small capacity, and at the largest span holds accept (2^51 µs).
func holdPolicies() map[string]Policy {
	return map[string]Policy{
		"token_bucket": {Limit: 10, Period: time.Hour},
		"gcra_burst":   {Algorithm: GCRA, Limit: 5, Period: time.Hour, Burst: 12},
		"leaky_bucket": {Algorithm: LeakyBucket, Limit: 7, Period: time.Minute},
		"hold_edge":    {Limit: 1e6, Period: time.Second, Burst: maxHoldSpan},
	}
}

// reserveSubject describes store s reserving costs as the estimates of
// one hold over items of one (scope, key, p): what is admitted is held,
// and a denied reservation must hold and change nothing. A reservation of
// zeros alone records its holds (so that their settles can charge), which
// the suite's peek must not: the peek is the plain decision.
func reserveSubject(mk func() Store, state func(Store) (string, error), p Policy) hostiletest.Subject {
	st := mk()
	return hostiletest.Subject{
		Capacity: p.Capacity(),
		Warm:     warmOf(p),
		Batch:    3,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			items := make([]Item, 0, len(costs))
			for _, c := range costs {
				items = append(items, Item{Scope: "s", Key: "k", Policy: p, Cost: c})
			}
			if !slices.ContainsFunc(costs, func(c int64) bool { return c != 0 }) {
				out := make([]spillway.Decision, len(items))
				ok, err := st.Decide(ctx, items, out)
				return ok, out, err
			}
			h, err := st.(reserver).Reserve(ctx, items, time.Hour)
			if err != nil {
				return false, nil, err
			}
			return h.allowed, h.dec, nil
		},
		State: func(context.Context) (string, error) { return state(st) },
		Reset: func(context.Context) error { st = mk(); return nil },
	}
}

// limiterSubject describes a Limiter's Allow (one request) on store.
func limiterSubject(mk func() Store, state func(Store) (string, error), p Policy) hostiletest.Subject {
	var l *Limiter
	reset := func() {
		var err error
		if l, err = New(mk(), p, Settings{Scope: "lim"}); err != nil {
			panic(err)
		}
	}
	reset()
	return hostiletest.Subject{
		Capacity: p.Capacity(),
		Warm:     warmOf(p),
		Batch:    1,
		Decide: func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
			d, err := l.Allow(ctx, "k", costs[0])
			return d.Allowed, []spillway.Decision{d}, err
		},
		State: func(context.Context) (string, error) { return state(l.store) },
		Reset: func(context.Context) error { reset(); return nil },
	}
}

// dimensionSubject describes PerKey's Admit: Request.Cost, 0 is 1.
func dimensionSubject(s hostiletest.Subject, mk func() Store, p Policy) hostiletest.Subject {
	var d spillway.Limiter
	var st Store
	reset := func() {
		st = mk()
		l, err := New(st, p, Settings{Scope: "dim"})
		if err != nil {
			panic(err)
		}
		d = PerKey(l, spillway.DimUser)
	}
	reset()
	s.ZeroIsOne = true
	s.Decide = func(ctx context.Context, costs []int64) (bool, []spillway.Decision, error) {
		r := &spillway.Request{Priority: spillway.Critical, Cost: costs[0]}
		r.Set(spillway.DimUser, "u")
		dec, _, err := d.Admit(ctx, r)
		return dec.Allowed, []spillway.Decision{dec}, err
	}
	inner := s.State
	s.State = func(ctx context.Context) (string, error) { return inner(ctx) }
	s.Reset = func(context.Context) error { reset(); return nil }
	return s
}

// TestHostileLimiters runs the suite on Limiter.Allow and on
// PerKey's Admit (Request.Cost), over the memory store (its
// allocation-free path) and Redis.
func TestHostileLimiters(t *testing.T) {
	node := redistest.Start(t).Client(t)
	clock := func() time.Time { return hostileT0 }
	for name, p := range hostilePolicies() {
		t.Run(name, func(t *testing.T) {
			var mem *MemoryStore
			mkMem := func() Store { mem = NewMemoryStore(MemorySettings{Clock: clock}); return mem }
			memState := func(Store) (string, error) { return memState(mem), nil }
			mkRed := func() Store {
				_ = hostiletest.RedisDelete(context.Background(), node, "hl:*")
				return mustRedisStore(node, RedisSettings{Clock: clock, Prefix: "hl:"})
			}
			redState := func(Store) (string, error) { return hostiletest.RedisState(context.Background(), node, "hl:*") }
			t.Run("memory", func(t *testing.T) { hostiletest.Run(t, limiterSubject(mkMem, memState, p)) })
			t.Run("redis", func(t *testing.T) { hostiletest.Run(t, limiterSubject(mkRed, redState, p)) })
			t.Run("differential", func(t *testing.T) {
				hostiletest.RunDifferential(t, limiterSubject(mkMem, memState, p), limiterSubject(mkRed, redState, p))
			})
			base := hostiletest.Subject{Capacity: p.Capacity(), Warm: warmOf(p), Batch: 1}
			base.State = func(context.Context) (string, error) { return memState(nil) }
			t.Run("dimension/memory", func(t *testing.T) { hostiletest.Run(t, dimensionSubject(base, mkMem, p)) })
			base.State = func(context.Context) (string, error) { return redState(nil) }
			t.Run("dimension/redis", func(t *testing.T) { hostiletest.Run(t, dimensionSubject(base, mkRed, p)) })
		})
	}
}

// FuzzRedisVsMemory drives random policies and costs — the hostile
// edges among the seeds — through the Redis scripts and through the
// memory store on one fixed clock, and requires the same outcome: the
// same error or none, the same verdict and the same decisions, for a
// first batch on an empty state and a second on what the first left.
// `go test` replays the seeds and testdata/fuzz/FuzzRedisVsMemory; run
// `go test -fuzz FuzzRedisVsMemory ./ratelimit` to search further.
func FuzzRedisVsMemory(f *testing.F) {
	const e53 = int64(1) << 53
	seeds := []struct {
		alg                               uint8
		limit, periodUS, burst, w, c1, c2 int64
	}{
		{0, 1e6, 1e6, MaxSpanMicros, MaxSpanMicros / 2, MaxSpanMicros + 1, 1},
		{0, 1e6, 1e6, e53, 1, e53 + 1, 1},
		{1, 1e6, 1e6, MaxSpanMicros, 1 << 40, e53 - 1, e53},
		{5, 3, 10, MaxSpanMicros / 4, 1 << 38, 1 << 62, math.MaxInt64},
		{0, 10, 3600e6, 0, 5, 6, 5},
		{2, 10, 3600e6, 0, 4, 7, -1},
		{4, 10, 3600e6, 0, 9, 2, e53 + 1},
		{3, 10, 3600e6, 0, 3, 8, 11},
		{0, 1, MaxSpanMicros, 0, 1, 2, 0},
		{2, 2, MaxSpanMicros, 0, 1, 1, 1 << 62},
		{0, math.MaxInt64, 1e6, 0, 1, 1, 1},
		{1, 7, 60e6, math.MaxInt64, 1, 1, 1},
		{6, 10, 3600e6, 0, 9, 2, 11},     // sliding window buckets, default N, interpolated
		{6, 7, 60e6, 1<<8 | 60, 3, 5, 8}, // N = 60, conservative
		{6, 3, 1e6 + 1, 0, 1, 1, 1},      // a period not a multiple of N: both reject it
		{6, 1e6, MaxSpanMicros, 1000, e53, 1, 1 << 40},
	}
	for _, s := range seeds {
		f.Add(s.alg, s.limit, s.periodUS, s.burst, s.w, s.c1, s.c2)
	}
	rdb := redistest.Start(f).Client(f)
	var run atomic.Int64
	f.Fuzz(func(t *testing.T, alg uint8, limit, periodUS, burst, w, c1, c2 int64) {
		p := Policy{Algorithm: Algorithm(alg % uint8(numAlgorithms)), Limit: limit, Period: time.Duration(periodUS) * time.Microsecond, Burst: burst}
		if periodUS > math.MaxInt64/1000 || periodUS < -math.MaxInt64/1000 {
			p.Period = time.Duration(math.MaxInt64) // out of range either way: the stores must agree it is invalid
		}
		if p.Algorithm == SlidingWindowLog && p.Limit > 1000 {
			return // one sorted-set member per unit: keep a run fast
		}
		if p.Algorithm == SlidingWindowBuckets {
			// burst, which a window ignores, picks N (low byte) and the mode
			p.Buckets, p.Mode, p.Burst = burst&0xff, WindowMode(burst>>8&0xff), 0
		}
		ctx := context.Background()
		prefix := fmt.Sprintf("fz%d:", run.Add(1))
		defer hostiletest.RedisDelete(ctx, rdb, prefix+"*")
		clock := func() time.Time { return hostileT0 }
		stores := [2]Store{NewMemoryStore(MemorySettings{Clock: clock}), mustRedisStore(rdb, RedisSettings{Clock: clock, Prefix: prefix})}
		other := Policy{Algorithm: FixedWindow, Limit: 1000, Period: time.Hour}
		batches := [][]Item{
			{{Scope: "s", Key: "a", Policy: p, Cost: w}},
			{{Scope: "s", Key: "a", Policy: p, Cost: c1}, {Scope: "s", Key: "b", Policy: p, Cost: c2}, {Scope: "o", Key: "a", Policy: other, Cost: 1}},
		}
		for i, items := range batches {
			var oks [2]bool
			var errs [2]error
			outs := [2][]spillway.Decision{make([]spillway.Decision, len(items)), make([]spillway.Decision, len(items))}
			for j, st := range stores {
				oks[j], errs[j] = st.Decide(ctx, items, outs[j])
			}
			if (errs[0] == nil) != (errs[1] == nil) {
				t.Fatalf("%v batch %d: memory error %v, redis error %v", p, i, errs[0], errs[1])
			}
			if errs[0] != nil {
				return
			}
			if oks[0] != oks[1] || !slices.Equal(outs[0], outs[1]) {
				t.Fatalf("%v batch %d %+v:\nmemory %v %+v\nredis  %v %+v", p, i, items, oks[0], outs[0], oks[1], outs[1])
			}
			for k, d := range outs[0] {
				if items[k].Cost > items[k].Policy.Capacity() && (d.Allowed || d.Reason != spillway.ReasonCostExceedsLimit) {
					t.Fatalf("%v batch %d item %d: cost %d above capacity %d decided %+v", p, i, k, items[k].Cost, items[k].Policy.Capacity(), d)
				}
			}
			// Redis expires keys on its own clock: when a state the first
			// batch wrote lives less than a second, the second batch could
			// see it gone where the memory store (on the fixed clock)
			// still has it; stop there.
			keys, err := rdb.Keys(ctx, prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if pttl, err := rdb.PTTL(ctx, k).Result(); err != nil || pttl < time.Second {
					return
				}
			}
		}
	})
}
