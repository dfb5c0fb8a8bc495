// Command quickstart shows spillway's request-rate limiters deciding, with
// nothing but Go: an in-memory store, a simulated clock so the output is
// the same on every run, and four of the six algorithms side by side.
//
//	go -C examples run ./quickstart
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/ratelimit"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	// A simulated clock: the demo moves now forward itself.
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{Clock: func() time.Time { return now }})

	policies := []ratelimit.Policy{
		{Algorithm: ratelimit.TokenBucket, Limit: 5, Period: time.Second, Burst: 3},
		{Algorithm: ratelimit.SlidingWindowCounter, Limit: 3, Period: time.Second},
		{Algorithm: ratelimit.FixedWindow, Limit: 3, Period: time.Second},
		{Algorithm: ratelimit.SlidingWindowLog, Limit: 3, Period: time.Second},
	}
	for _, p := range policies {
		lim, err := ratelimit.New(store, p, ratelimit.Settings{})
		if err != nil {
			return err
		}
		fmt.Printf("== %s (limit reported: %d)\n", p, p.Capacity())
		start := now
		// A client sends a request every 100ms for a second, then one more
		// after a pause.
		for i := 0; i < 10; i++ {
			show(ctx, lim, now.Sub(start))
			now = now.Add(100 * time.Millisecond)
		}
		now = now.Add(time.Second)
		show(ctx, lim, now.Sub(start))
		fmt.Println()
	}

	// A cost above what a policy can ever admit is an explicit denial.
	p := ratelimit.Policy{Limit: 10, Period: time.Second}
	lim, err := ratelimit.New(store, p, ratelimit.Settings{})
	if err != nil {
		return err
	}
	d, err := lim.Allow(ctx, "client-1", 11)
	if err != nil {
		return err
	}
	fmt.Printf("== cost 11 against %s: allowed=%v reason=%s retry_after=%v\n\n", p, d.Allowed, d.Reason, d.RetryAfter)

	// An invalid policy is an error that names the field.
	if _, err := ratelimit.New(store, ratelimit.Policy{Limit: 0, Period: time.Second}, ratelimit.Settings{}); err != nil {
		fmt.Printf("== invalid policy: %v\n\n", err)
	}

	// In a chain, keyed by the client's IP.
	perIP, err := ratelimit.New(store, ratelimit.Policy{Limit: 2, Period: time.Second}, ratelimit.Settings{Scope: "per-ip"})
	if err != nil {
		return err
	}
	chain := spillway.Chain(ratelimit.PerKey(perIP, spillway.DimIP))
	fmt.Println("== chain keyed by ip")
	for _, ip := range []string{"192.0.2.1", "192.0.2.1", "192.0.2.1", "192.0.2.2"} {
		r := &spillway.Request{Endpoint: "/search", Method: "GET", Priority: spillway.Critical}
		r.Set(spillway.DimIP, ip)
		d, done, err := chain.Admit(ctx, r)
		if err != nil {
			return err
		}
		done(spillway.Success)
		status := 200
		if !d.Allowed {
			status = 429
		}
		fmt.Printf("ip=%-10s %d  limiter=%s remaining=%d retry_after=%v\n", ip, status, d.Limiter, d.Remaining, d.RetryAfter)
	}
	return nil
}

func show(ctx context.Context, lim *ratelimit.Limiter, at time.Duration) {
	d, err := lim.Allow(ctx, "client-1", 1)
	if err != nil {
		fmt.Printf("t=%-6v error: %v\n", at, err)
		return
	}
	verdict := "allowed"
	if !d.Allowed {
		verdict = "DENIED "
	}
	fmt.Printf("t=%-6v %s remaining=%d reset_after=%-6v retry_after=%v\n", at, verdict, d.Remaining, d.ResetAfter, d.RetryAfter)
}
