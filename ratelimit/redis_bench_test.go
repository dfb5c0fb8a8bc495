package ratelimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

// BenchmarkRedisStore measures one Decide against a local redis-server: a
// single token-bucket item (the lean script) and a three-item batch (the
// batch script), with allocations. Run it briefly:
//
//	go test -run '^$' -bench RedisStore -benchtime 20000x ./ratelimit/
func BenchmarkRedisStore(b *testing.B) {
	_, c := redisServer(b)
	s := NewRedisStore(c)
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
	b.Run("batch3", func(b *testing.B) {
		b.ReportAllocs()
		out := make([]spillway.Decision, 3)
		items := make([]Item, 3)
		for i := 0; b.Loop(); i++ {
			k := keys[i%len(keys)]
			items[0] = Item{Scope: "ip", Key: k, Policy: p, Cost: 1}
			items[1] = Item{Scope: "user", Key: k, Policy: p, Cost: 1}
			items[2] = Item{Scope: "endpoint", Key: k, Policy: w, Cost: 1}
			if _, err := s.Decide(ctx, items, out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
