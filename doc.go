// Package spillway is the contract shared by every building block of the
// toolkit: a Request to admit, the Decision about it, the Priority that orders
// shedding, the Limiter interface that every block implements, and Chain,
// which composes blocks in front of a handler.
//
// The blocks live in sub-packages: ratelimit (request-rate algorithms on a
// memory or Redis store), tiers (YAML rules), concurrency (in-flight limits),
// globalceiling (a fleet-wide ceiling in front of a shared resource), shedder
// (priority-aware load shedding), fallback (fail-open with a bounded blast
// radius) and the adapters httpx and grpcx (grpcx, like rls, the Envoy rate
// limit service, is a module of its own: github.com/spillway-go/spillway/grpcx).
//
// The shortest use:
//
//	lim, _ := ratelimit.New(ratelimit.NewMemoryStore(ratelimit.MemorySettings{}), ratelimit.Policy{Limit: 10, Period: time.Second}, ratelimit.Settings{})
//	chain := spillway.Chain(ratelimit.PerKey(lim, spillway.DimIP))
//	d, done, err := chain.Admit(ctx, &spillway.Request{Endpoint: "/api", Cost: 1})
//	if err == nil && d.Allowed {
//		defer done(spillway.Success)
//	}
//
// Everything in this package is safe for concurrent use.
package spillway
