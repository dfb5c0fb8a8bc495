package ratelimit

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
)

// countHook counts the commands a client sends: each is one round trip
// (a script call is one EVALSHA; a NOSCRIPT retry would be a second).
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// BenchmarkRedisHold compares, side by side in one run against a
// redis-server the benchmark starts, one plain decision with one reserve
// followed by its settle, as a lone caller makes them: for one item (the
// lean token-bucket script against the hold and settle scripts) and for
// three items of one entity (a tiers-like batch: the buckets script
// against three held items). Rounds of 100 alternate, so that a changing
// load weighs on both alike. It reports the wall time of each, their
// ratio, the round trips per reserve+settle and the server time of the
// scripts (INFO commandstats) of each:
//
//	go test -run '^$' -bench RedisHold -benchtime 20000x ./ratelimit/
func BenchmarkRedisHold(b *testing.B) {
	srv, _ := redisServer(b)
	c := srv.Client(b)
	hook := &countHook{}
	c.AddHook(hook)
	s := mustRedisStore(c)
	ctx := context.Background()
	p := Policy{Limit: 1_000_000, Period: time.Second}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "user" + strconv.Itoa(i)
	}
	run := func(b *testing.B, n int) {
		b.ReportAllocs()
		items := make([]Item, n)
		out := make([]spillway.Decision, n)
		set := func(k string) {
			for j := range items {
				items[j] = Item{Scope: "tier" + strconv.Itoa(j), Key: k, Policy: p, Cost: 1}
			}
		}
		plain := func(k string) {
			set(k)
			if ok, err := s.Decide(ctx, items, out); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
		hold := func(k string) {
			set(k)
			h, err := s.Reserve(ctx, items, time.Minute)
			if err != nil || !h.allowed {
				b.Fatal(h, err)
			}
			if r, err := h.Settle(ctx, 2); err != nil || r != SettleApplied {
				b.Fatal(r, err)
			}
		}
		plain(keys[0]) // load the scripts
		hold(keys[0])
		var wall [2]time.Duration
		var usec [2]float64
		var trips int64
		const round = 100
		b.ResetTimer()
		for i := 0; i < b.N; i += round {
			for v, f := range []func(string){plain, hold} {
				b.StopTimer()
				if err := c.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				before := hook.n.Load()
				start := time.Now()
				for j := i; j < i+round && j < b.N; j++ {
					f(keys[j%len(keys)])
				}
				wall[v] += time.Since(start)
				if v == 1 {
					trips += hook.n.Load() - before
				}
				b.StopTimer()
				usec[v] += scriptUsec(b, c)
				b.StartTimer()
			}
		}
		nn := float64(b.N)
		b.ReportMetric(float64(wall[0].Nanoseconds())/nn, "plain-ns/op")
		b.ReportMetric(float64(wall[1].Nanoseconds())/nn, "reserve+settle-ns/op")
		b.ReportMetric(float64(wall[1])/float64(wall[0]), "ratio")
		b.ReportMetric(float64(trips)/nn, "round-trips/hold")
		b.ReportMetric(usec[0]/nn, "plain-server-µs/op")
		b.ReportMetric(usec[1]/nn, "reserve+settle-server-µs/op")
	}
	b.Run("single", func(b *testing.B) { run(b, 1) })
	b.Run("three", func(b *testing.B) { run(b, 3) })
}
