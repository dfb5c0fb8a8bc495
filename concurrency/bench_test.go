package concurrency

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/internal/redistest"
)

// BenchmarkAcquireRelease: one admission and its release per op, on the
// memory store and on a real redis-server (one EVALSHA + one ZREM), over
// 64 keys, in parallel; cost 1, and cost 3 (Acquire of 3: 3 members
// added by the script, 3 removed by the ZREM).
//
//	go test -run '^$' -bench . -benchmem ./concurrency
func BenchmarkAcquireRelease(b *testing.B) {
	run := func(b *testing.B, store Store, cost int64) {
		lim, err := New(store, 1000, Settings{})
		if err != nil {
			b.Fatal(err)
		}
		keys := make([]string, 64)
		for i := range keys {
			keys[i] = "user-" + strconv.Itoa(i)
		}
		var n atomic.Uint64
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				d, done, err := lim.Acquire(ctx, keys[n.Add(1)%64], cost)
				if err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				done(spillway.Success)
			}
		})
	}
	redisStore := func(b *testing.B) Store {
		srv := redistest.Start(b)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
		b.Cleanup(func() { rdb.Close() })
		s, _ := NewRedisStore(rdb, RedisSettings{})
		return s
	}
	b.Run("memory", func(b *testing.B) { run(b, NewMemoryStore(MemorySettings{}), 1) })
	b.Run("redis", func(b *testing.B) { run(b, redisStore(b), 1) })
	b.Run("memory-cost3", func(b *testing.B) { run(b, NewMemoryStore(MemorySettings{}), 3) })
	b.Run("redis-cost3", func(b *testing.B) { run(b, redisStore(b), 3) })
}

// BenchmarkAdaptive: Admit and Done on an Adaptive with each algorithm.
func BenchmarkAdaptive(b *testing.B) {
	for _, name := range []string{"aimd", "latency"} {
		b.Run(name, func(b *testing.B) {
			var alg Algorithm
			if name == "aimd" {
				alg, _ = NewAIMD(AIMDConfig{Initial: 1000, Max: 1000})
			} else {
				alg, _ = NewLatencyLimit(LatencyConfig{Initial: 1000, Max: 1000})
			}
			a, _ := NewAdaptive(alg, "")
			r := &spillway.Request{Priority: spillway.Critical}
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d, done, _ := a.Admit(ctx, r)
					if d.Allowed {
						done(spillway.Success)
					}
				}
			})
		})
	}
}
