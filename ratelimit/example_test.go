package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

// A fixed clock makes the examples' output exact; real code leaves
// Clock out.
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func Example() {
	lim, err := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return start }}), ratelimit.Policy{Limit: 3, Period: time.Second}, ratelimit.Settings{Scope: "api"})
	if err != nil {
		panic(err)
	}
	for i := 0; i < 4; i++ {
		d, err := lim.Allow(context.Background(), "203.0.113.7", 1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry_after=%v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry_after=0s
	// allowed=true remaining=1 retry_after=0s
	// allowed=true remaining=0 retry_after=0s
	// allowed=false remaining=0 retry_after=334ms
}

func ExampleLimiter_Allow() {
	now := start
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return now }})
	lim, _ := ratelimit.New(store, ratelimit.Policy{Algorithm: ratelimit.GCRA, Limit: 10, Period: time.Second, Burst: 5}, ratelimit.Settings{})
	ctx := context.Background()

	d, _ := lim.Allow(ctx, "user-42", 4) // cost 4 of a burst of 5
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = lim.Allow(ctx, "user-42", 0) // cost 0 peeks
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = lim.Allow(ctx, "user-42", 6) // above the burst: can never succeed
	fmt.Println(d.Allowed, d.Reason, d.RetryAfter)
	now = now.Add(250 * time.Millisecond) // 2.5 tokens come back
	d, _ = lim.Allow(ctx, "user-42", 3)
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 1 400ms
	// true 1
	// false cost_exceeds_limit 0s
	// true 0
}

func ExampleLimiter_Schedule() {
	// A leaky bucket used as a queue: up to 3 requests wait their turn,
	// leaving one every 100ms, instead of being admitted at once.
	lim, _ := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return start }}), ratelimit.Policy{Algorithm: ratelimit.LeakyBucket, Limit: 10, Period: time.Second, Burst: 3}, ratelimit.Settings{})
	for i := 0; i < 4; i++ {
		d, delay, _ := lim.Schedule(context.Background(), "worker", 1)
		fmt.Printf("allowed=%v delay=%v retry_after=%v\n", d.Allowed, delay, d.RetryAfter)
	}
	// Output:
	// allowed=true delay=0s retry_after=0s
	// allowed=true delay=100ms retry_after=0s
	// allowed=true delay=200ms retry_after=0s
	// allowed=false delay=0s retry_after=100ms
}

func ExamplePerKey() {
	lim, _ := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return start }}), ratelimit.Policy{Algorithm: ratelimit.FixedWindow, Limit: 2, Period: time.Minute}, ratelimit.Settings{Scope: "login"})
	chain := spillway.Chain(ratelimit.PerKey(lim, spillway.DimIP))
	for i := 0; i < 3; i++ {
		r := &spillway.Request{Endpoint: "/login", Priority: spillway.Critical}
		r.Set(spillway.DimIP, "198.51.100.9")
		d, done, err := chain.Admit(context.Background(), r)
		if err != nil {
			panic(err)
		}
		done(spillway.Success)
		fmt.Println(d.Limiter, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// login:ip true 1 0s
	// login:ip true 0 0s
	// login:ip false 0 1m0s
}

func ExampleMemoryStore_Decide() {
	// Two tiers decided together, all or nothing: the per-user limit has
	// room, the per-IP one does not, so nothing is charged.
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return start }})
	perIP := ratelimit.Policy{Limit: 1, Period: time.Second}
	perUser := ratelimit.Policy{Algorithm: ratelimit.SlidingWindowLog, Limit: 100, Period: time.Hour}
	ctx := context.Background()
	items := []ratelimit.Item{
		{Scope: "per-user", Key: "alice", Policy: perUser, Cost: 1},
		{Scope: "per-ip", Key: "192.0.2.1", Policy: perIP, Cost: 1},
	}
	out := make([]spillway.Decision, len(items))
	for i := 0; i < 2; i++ {
		ok, _ := store.Decide(ctx, items, out)
		fmt.Println(ok, out[0].Remaining, out[1].Allowed, out[1].Reason)
	}
	ok, _ := store.Decide(ctx, items[:1], out) // alice alone: only the first batch charged her
	fmt.Println(ok, out[0].Remaining)
	// Output:
	// true 99 true none
	// false 98 false rate_limited
	// true 98
}

func ExampleLimiter_Reserve() {
	// Tokens per minute per API key, when a request's cost (the tokens a
	// model generates) is known only after the work: hold an estimate,
	// settle the actual count.
	now := start
	lim, _ := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return now }}), ratelimit.Policy{Limit: 1000, Period: time.Minute}, ratelimit.Settings{Scope: "tokens", HoldTTL: 2 * time.Minute})
	ctx := context.Background()

	h, _ := lim.Reserve(ctx, "key-42", 500) // the request may generate up to 500 tokens
	fmt.Println(h.Decision().Allowed, h.Decision().Remaining)
	r, _ := h.Settle(ctx, 120) // it generated 120: 380 come back
	fmt.Println(r, h.Decision().Remaining)
	d, _ := lim.Allow(ctx, "key-42", 0)
	fmt.Println(d.Remaining)

	// Generating more than estimated puts the key into debt (up to one
	// burst): the next requests wait until it is repaid.
	h, _ = lim.Reserve(ctx, "key-42", 100)
	r, _ = h.Settle(ctx, 1500)
	d, _ = lim.Allow(ctx, "key-42", 1)
	fmt.Println(r, d.Allowed, d.RetryAfter)

	// Settling twice changes nothing.
	r, _ = h.Settle(ctx, 1500)
	fmt.Println(r)
	// Output:
	// true 500
	// applied 500
	// 880
	// applied false 37.26s
	// already_settled
}
