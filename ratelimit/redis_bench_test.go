package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// BenchmarkRedisStore measures one Decide against a local redis-server: a
// single token-bucket item (the lean script), three token-bucket items (the
// buckets script) and a three-item batch with a window (the batch script),
// with allocations. Run it briefly:
//
//	go test -run '^$' -bench RedisStore -benchtime 20000x ./ratelimit/
func BenchmarkRedisStore(b *testing.B) {
	_, c := redisServer(b)
	s := mustRedisStore(c)
	ctx := context.Background()
	p := Policy{Limit: 1_000_000, Period: time.Second}
	w := Policy{Algorithm: SlidingWindowCounter, Limit: 1_000_000, Period: time.Minute}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "user" + strconv.Itoa(i)
	}
	b.Run("single", func(b *testing.B) {
		b.ReportAllocs()
		out := make([]spillway.Decision, 1)
		items := make([]Item, 1)
		for i := 0; b.Loop(); i++ {
			items[0] = Item{Scope: "api", Key: keys[i%len(keys)], Policy: p, Cost: 1}
			if _, err := s.Decide(ctx, items, out); err != nil {
				b.Fatal(err)
			}
		}
	})
	// three decides ip and user under p and endpoint under third.
	three := func(b *testing.B, third Policy) {
		b.ReportAllocs()
		out := make([]spillway.Decision, 3)
		items := make([]Item, 3)
		for i := 0; b.Loop(); i++ {
			k := keys[i%len(keys)]
			items[0] = Item{Scope: "ip", Key: k, Policy: p, Cost: 1}
			items[1] = Item{Scope: "user", Key: k, Policy: p, Cost: 1}
			items[2] = Item{Scope: "endpoint", Key: k, Policy: third, Cost: 1}
			if _, err := s.Decide(ctx, items, out); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("buckets3", func(b *testing.B) { three(b, p) })
	b.Run("batch3", func(b *testing.B) { three(b, w) })
}

// BenchmarkRedisScriptCPU measures the server's CPU per script call (INFO
// commandstats) for one token-bucket item (the lean script), three bucket
// items (the buckets script) and the same three items through the general
// batch script, in alternating rounds so that a changing load weighs on
// all alike:
//
//	go test -run '^$' -bench RedisScriptCPU -benchtime 20000x ./ratelimit/
func BenchmarkRedisScriptCPU(b *testing.B) {
	_, c := redisServer(b)
	s := mustRedisStore(c)
	ctx := context.Background()
	p := Policy{Limit: 1_000_000, Period: time.Second}
	out := make([]spillway.Decision, 3)
	one := make([]Item, 1)
	three := make([]Item, 3)
	variants := []func(k string) error{
		func(k string) error {
			one[0] = Item{Scope: "ip", Key: k, Policy: p, Cost: 1}
			_, err := s.Decide(ctx, one, out)
			return err
		},
		func(k string) error {
			three[0] = Item{Scope: "ip", Key: k, Policy: p, Cost: 1}
			three[1] = Item{Scope: "user", Key: k, Policy: p, Cost: 1}
			three[2] = Item{Scope: "api", Key: k, Policy: p, Cost: 1}
			_, err := s.Decide(ctx, three, out)
			return err
		},
		func(k string) error {
			three[0] = Item{Scope: "ip", Key: k, Policy: p, Cost: 1}
			three[1] = Item{Scope: "user", Key: k, Policy: p, Cost: 1}
			three[2] = Item{Scope: "api", Key: k, Policy: p, Cost: 1}
			_, _, err := s.runBatch(ctx, three, out, nil)
			return err
		},
	}
	var usec [3]float64
	const round = 100
	for i := 0; i < b.N; i += round {
		for v, f := range variants {
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			for j := i; j < i+round && j < b.N; j++ {
				if err := f("user" + strconv.Itoa(j%1000)); err != nil {
					b.Fatal(err)
				}
			}
			usec[v] += scriptUsec(b, c)
		}
	}
	n := float64(b.N)
	b.ReportMetric(usec[0]/n, "single-server-µs/call")
	b.ReportMetric(usec[1]/n, "buckets3-server-µs/call")
	b.ReportMetric(usec[2]/n, "batch3-server-µs/call")
	b.ReportMetric(usec[1]/usec[0], "buckets3/single")
	b.ReportMetric(usec[2]/usec[0], "batch3/single")
}

// scriptUsec is the server time of the script calls (EVALSHA and EVAL)
// since the last CONFIG RESETSTAT, from INFO commandstats, in µs.
func scriptUsec(tb testing.TB, c *redis.Client) float64 {
	st := redistest.ReadCommandStats(tb, c)
	return st["evalsha"].Usec + st["eval"].Usec
}
