package fallback_test

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
	"github.com/spillway-go/spillway/fallback"
	"github.com/spillway-go/spillway/internal/faultproxy"
	"github.com/spillway-go/spillway/internal/redistest"
	"github.com/spillway-go/spillway/ratelimit"
)

// latencies collects per-decision wall times and reports p50/p99.
type latencies []time.Duration

func (l latencies) report(b *testing.B) {
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	pct := func(p float64) float64 { return float64(l[int(float64(len(l)-1)*p)].Nanoseconds()) }
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
}

// BenchmarkDecisionLatency measures one decision through fallback.Store
// over a real redis-server on loopback in three states: Redis healthy
// (directly, and through the fault proxy that the other cases need), Redis
// stalled behind the proxy with the breaker open, and Redis
// recovering (the stall lifted, the breaker half-open, probes and the
// reconcile pass in flight). "memory" is a bare MemoryStore for reference.
//
//	go test -run '^$' -bench DecisionLatency -benchtime 20000x ./fallback/
func BenchmarkDecisionLatency(b *testing.B) {
	srv := redistest.Start(b)
	proxy, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	opt := &redis.Options{Addr: proxy.Addr()}
	fallback.TuneOptions(opt)
	client := redis.NewClient(opt)
	defer client.Close()
	policy := ratelimit.Policy{Limit: 1_000_000_000, Period: time.Hour}
	items := []ratelimit.Item{{Scope: "api", Key: "k", Policy: policy, Cost: 1}}
	out := make([]spillway.Decision, 1)
	ctx := context.Background()

	directOpt := &redis.Options{Addr: srv.Addr}
	fallback.TuneOptions(directOpt)
	direct := redis.NewClient(directOpt)
	defer direct.Close()
	newStoreOn := func(b *testing.B, c *redis.Client, openTimeout time.Duration) *fallback.Store {
		st, err := fallback.NewStore(mustRedisStore(c), fallback.Settings{
			Budget: 50 * time.Millisecond, OpenTimeout: openTimeout,
		})
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	newStore := func(b *testing.B, openTimeout time.Duration) *fallback.Store {
		return newStoreOn(b, client, openTimeout)
	}
	run := func(b *testing.B, st ratelimit.Store, n int, lat *latencies) {
		for i := 0; i < n; i++ {
			items[0].Key = "k" + strconv.Itoa(i%1000)
			start := time.Now()
			if _, err := st.Decide(ctx, items, out); err != nil {
				b.Fatal(err)
			}
			*lat = append(*lat, time.Since(start))
		}
	}

	b.Run("memory", func(b *testing.B) {
		lat := make(latencies, 0, b.N)
		run(b, ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), b.N, &lat)
		lat.report(b)
	})
	b.Run("healthy", func(b *testing.B) {
		st := newStoreOn(b, direct, time.Hour)
		lat := make(latencies, 0, b.N)
		run(b, st, b.N, &lat)
		lat.report(b)
		b.ReportMetric(float64(st.Stats().Degraded), "degraded")
	})
	b.Run("healthy_via_proxy", func(b *testing.B) {
		st := newStore(b, time.Hour)
		lat := make(latencies, 0, b.N)
		run(b, st, b.N, &lat)
		lat.report(b)
		// Calls over the budget on a loaded machine are decided locally.
		b.ReportMetric(float64(st.Stats().Degraded), "degraded")
	})
	b.Run("stalled_open", func(b *testing.B) {
		st := newStore(b, time.Hour)
		_ = proxy.SetMode(faultproxy.Stall)
		defer func() { _ = proxy.SetMode(faultproxy.Pass) }()
		var warm latencies
		run(b, st, 5, &warm) // K failures, each costs the budget, open the breaker
		if st.State() != fallback.Open {
			b.Fatalf("breaker %v after 5 stalled calls", st.State())
		}
		b.ResetTimer()
		lat := make(latencies, 0, b.N)
		run(b, st, b.N, &lat)
		lat.report(b)
	})
	b.Run("recovering", func(b *testing.B) {
		// Each cycle: refuse connections (Redis down), open the breaker,
		// accept again, wait for half-open, then measure the next 200
		// decisions: the probes (on fresh connections), local decisions
		// while the probes are out, the reconcile pass, the closed breaker.
		st := newStore(b, 10*time.Millisecond)
		lat := make(latencies, 0, b.N)
		var warm latencies
		for done := 0; done < b.N; {
			b.StopTimer()
			_ = proxy.SetMode(faultproxy.Refuse)
			for st.State() != fallback.Open {
				run(b, st, 1, &warm)
			}
			run(b, st, 20, &warm) // local admissions to reconcile
			_ = proxy.SetMode(faultproxy.Pass)
			time.Sleep(15 * time.Millisecond)
			b.StartTimer()
			n := min(b.N-done, 200)
			run(b, st, n, &lat)
			done += n
		}
		lat.report(b)
	})
}

// BenchmarkOpenBreaker compares a decision through an open breaker (the
// local share) with a bare MemoryStore, over 1000 keys, in parallel.
//
//	go test -run '^$' -bench OpenBreaker -benchmem ./fallback/
func BenchmarkOpenBreaker(b *testing.B) {
	policy := ratelimit.Policy{Limit: 1_000_000_000, Period: time.Hour}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	bench := func(b *testing.B, st ratelimit.Store) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			items := []ratelimit.Item{{Scope: "api", Policy: policy, Cost: 1}}
			out := make([]spillway.Decision, 1)
			i := 0
			for pb.Next() {
				items[0].Key = keys[i%len(keys)]
				i++
				if _, err := st.Decide(context.Background(), items, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("memory", func(b *testing.B) { bench(b, ratelimit.NewMemoryStore(ratelimit.MemorySettings{})) })
	b.Run("open", func(b *testing.B) {
		st, err := fallback.NewStore(downStore{}, fallback.Settings{Failures: 1, OpenTimeout: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		bench(b, st)
	})
}

// BenchmarkWrapperThroughput compares, on one real redis-server at 64
// goroutines over 10,000 keys, decisions through the bare RedisStore
// ("bare") with decisions through a fallback.Store over it, every client
// built from bare redis.Options: "fallback", the Store given no Health
// (NewStore made the store's client honour deadlines: calls run on the
// caller's goroutine); "health", the Store given its client's Health (the
// same, plus the Health's hook on every command); "detached", the Store
// over a store that does not name its client (a goroutine per call,
// returning at the budget whatever the store does). Each contender has a
// client and keys of its own, and a budget of 1 s: a decision the loaded
// machine delays past 50 ms would be local (and fast) and open the
// breaker. go test -count runs each contender's rounds
// one after the other: to alternate them, run the binary several times.
//
//	go test -c -o /tmp/fb.test ./fallback/ && for i in 1 2 3; do /tmp/fb.test -test.run '^$' -test.bench WrapperThroughput -test.benchtime 100000x; done
func BenchmarkWrapperThroughput(b *testing.B) {
	srv := redistest.Start(b)
	policy := ratelimit.Policy{Limit: 1_000_000_000, Period: time.Hour}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	newClient := func(b *testing.B) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		b.Cleanup(func() { c.Close() })
		return c
	}
	bench := func(b *testing.B, st ratelimit.Store) {
		b.ReportAllocs()
		b.SetParallelism(64 / runtimeProcs())
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			items := []ratelimit.Item{{Scope: "api", Policy: policy, Cost: 1}}
			out := make([]spillway.Decision, 1)
			i := 0
			for pb.Next() {
				items[0].Key = keys[i%len(keys)]
				i += 7
				if _, err := st.Decide(context.Background(), items, out); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		if fb, ok := st.(*fallback.Store); ok {
			b.ReportMetric(float64(fb.Stats().Degraded), "degraded")
		}
	}
	prefix := func(name string) ratelimit.RedisSettings {
		return ratelimit.RedisSettings{Prefix: "bench-" + name + ":"}
	}
	b.Run("bare", func(b *testing.B) {
		bench(b, mustRedisStore(newClient(b), prefix("bare")))
	})
	b.Run("fallback", func(b *testing.B) {
		st, err := fallback.NewStore(mustRedisStore(newClient(b), prefix("fallback")), fallback.Settings{Budget: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		bench(b, st)
	})
	b.Run("health", func(b *testing.B) {
		c := newClient(b)
		h, err := fallback.NewHealth(c, fallback.HealthSettings{})
		if err != nil {
			b.Fatal(err)
		}
		st, err := fallback.NewStore(mustRedisStore(c, prefix("health")), fallback.Settings{Health: h, Budget: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		bench(b, st)
	})
	b.Run("detached", func(b *testing.B) {
		st, err := fallback.NewStore(anonymousStore{mustRedisStore(newClient(b), prefix("detached"))}, fallback.Settings{Budget: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		bench(b, st)
	})
}

// anonymousStore is a store that does not name its client.
type anonymousStore struct{ ratelimit.Store }

func runtimeProcs() int { return max(runtime.GOMAXPROCS(0), 1) }

// BenchmarkDoneWhileOpen times the done of requests admitted by Redis
// before it hung (a slot of the Redis concurrency limiter and a `cost:
// response` hold of tiers behind a Store, on one client with its Health),
// called once the health is open: each is kept for later or refused
// without touching Redis. Run with a fixed count (every request is admitted
// before the timer starts):
//
//	go test -run '^$' -bench DoneWhileOpen -benchtime 1000x -count 3 ./fallback/
func BenchmarkDoneWhileOpen(b *testing.B) {
	srv := redistest.Start(b)
	proxy, err := faultproxy.NewProxy(srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	defer c.Close()
	h, err := fallback.NewHealth(c, fallback.HealthSettings{OpenTimeout: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	tstore, err := fallback.NewStore(mustRedisStore(c), fallback.Settings{Health: h})
	if err != nil {
		b.Fatal(err)
	}
	rate := tiersLimiter(b, anyClientRules, tstore)
	cstore, err := concurrency.NewRedisStore(c, concurrency.RedisSettings{})
	if err != nil {
		b.Fatal(err)
	}
	cshared, err := concurrency.New(cstore, 1_000_000, concurrency.Settings{Name: "bench-conc"})
	if err != nil {
		b.Fatal(err)
	}
	conc := concurrency.PerKey(cshared, spillway.DimIP) // falls back by itself on the client's health
	chain := spillway.Chain(rate, conc)
	ctx := context.Background()
	dones := make([]spillway.Done, b.N)
	for i := range dones {
		r := genRequest("10.9.0." + strconv.Itoa(i%250))
		d, done, err := chain.Admit(ctx, r)
		if err != nil || !d.Allowed || d.Degraded {
			b.Fatalf("admission %d: %+v %v", i, d, err)
		}
		_ = r.Usage.Set(3)
		dones[i] = done
	}
	if err := proxy.SetMode(faultproxy.Stall); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = proxy.SetMode(faultproxy.Pass) }()
	for h.State() != fallback.Open {
		_, done, _ := chain.Admit(ctx, genRequest("10.9.1.1"))
		done(spillway.Success)
	}
	received := proxy.Stats().Received
	lat := make(latencies, 0, b.N)
	b.ResetTimer()
	for _, done := range dones {
		start := time.Now()
		done(spillway.Success)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	lat.report(b)
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
	if got := proxy.Stats().Received - received; got != 0 {
		b.Fatalf("%d bytes sent towards Redis by the dones; want 0", got)
	}
}
