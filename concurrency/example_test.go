package concurrency_test

import (
	"context"
	"fmt"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/concurrency"
)

// At most two requests of one user in flight; the memory store stands in
// for NewRedisStore, which shares the limit across a fleet.
func Example() {
	lim, err := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 2, concurrency.Settings{TTL: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	_, done1, _ := lim.Acquire(ctx, "user-1", 1)
	_, done2, _ := lim.Acquire(ctx, "user-1", 1)
	d, _, _ := lim.Acquire(ctx, "user-1", 1)
	fmt.Println(d.Allowed, d.Reason, d.RetryAfter)

	done1(spillway.Success)
	done1(spillway.Success) // a second call does nothing
	d, done3, _ := lim.Acquire(ctx, "user-1", 1)
	fmt.Println(d.Allowed, d.Remaining)
	done2(spillway.Success)
	done3(spillway.Success)
	// Output:
	// false concurrency 1s
	// true 0
}

// PerKey makes a Limiter for a chain, keyed by a request dimension.
func ExamplePerKey() {
	lim, _ := concurrency.New(concurrency.NewMemoryStore(concurrency.MemorySettings{}), 1, concurrency.Settings{Name: "per-api-key"})
	chain := spillway.Chain(concurrency.PerKey(lim, spillway.DimAPIKey))
	r := &spillway.Request{Priority: spillway.Critical}
	r.Set(spillway.DimAPIKey, "sk_live_1")
	d, done, _ := chain.Admit(context.Background(), r)
	fmt.Println(d.Allowed, d.Limiter)
	d2, _, _ := chain.Admit(context.Background(), r)
	fmt.Println(d2.Allowed, d2.Reason)
	done(spillway.Success)
	// Output:
	// true per-api-key
	// false concurrency
}

// An adaptive local limit: drops shrink it, successes under load grow it.
func ExampleNewAdaptive() {
	alg, _ := concurrency.NewAIMD(concurrency.AIMDConfig{Initial: 10})
	lim, _ := concurrency.NewAdaptive(alg, "")
	d, done, _ := lim.Admit(context.Background(), &spillway.Request{Priority: spillway.Critical})
	fmt.Println(d.Allowed, d.Limit)
	done(spillway.Dropped) // a timeout: the limit backs off
	fmt.Println(lim.Limit())
	// Output:
	// true 10
	// 9
}
