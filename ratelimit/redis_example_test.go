package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// A limiter shared by a fleet: 100 requests per second per client IP, in
// bursts of up to 20, decided by one Lua script call against Redis.
func ExampleNewRedisStore() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{Prefix: "myapp:rl:"})
	if err != nil {
		panic(err) // a nil client or a prefix with a brace
	}
	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 100, Period: time.Second, Burst: 20}, ratelimit.Settings{Scope: "api"})
	if err != nil {
		panic(err) // the policy is invalid
	}
	d, err := lim.Allow(context.Background(), "203.0.113.7", 1)
	switch {
	case err != nil:
		fmt.Println("redis failed:", err) // fail open or closed: see package fallback
	case !d.Allowed:
		fmt.Println("429, retry after", d.RetryAfter)
	default:
		fmt.Println("allowed,", d.Remaining, "left")
	}
}

// Several limits decided together, all or nothing, in one round trip (one
// per Cluster slot): a per-IP and a per-user limit of one request.
func ExampleRedisStore_Decide() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	store, err := ratelimit.NewRedisStore(rdb, ratelimit.RedisSettings{})
	if err != nil {
		panic(err)
	}
	items := []ratelimit.Item{
		{Scope: "ip", Key: "203.0.113.7", Policy: ratelimit.Policy{Limit: 100, Period: time.Second}, Cost: 1},
		{Scope: "user", Key: "alice", Policy: ratelimit.Policy{Algorithm: ratelimit.SlidingWindowLog, Limit: 1000, Period: time.Hour}, Cost: 1},
	}
	out := make([]spillway.Decision, len(items))
	allowed, err := store.Decide(context.Background(), items, out)
	fmt.Println(allowed, err, out[0].Remaining, out[1].Remaining)
}
