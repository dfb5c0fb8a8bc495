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
// What is counted: a request costs Request.Cost units (0 means 1); with a
// Usage, Cost is the estimate and the blocks that charge the actual cost
// settle to what the handler reports (ReportUsage). A denial is a Decision,
// never an error: Reason says why (Reason.IsShed: answer 503, else 429) and
// RetryAfter when a retry can succeed. An Admit error means only that a
// shared store failed and nothing decided: it is a *StoreError (matching
// ErrStoreUnavailable) whose Fail is the FailMode the request's limits
// want, and the adapters admit or deny by it. The blocks fall back by
// themselves where they can (a local share of the limit, marked Degraded).
//
// One budget per request: Chain (or ChainBudget, for another length than
// DefaultBudget) bounds how long one admission waits on shared stores in
// all; a block that finds the budget spent decides locally (cause
// ErrBudgetSpent). httpx and grpcx start one budget per request, which
// every chain and guard the handler runs shares.
//
// Everything in this package is safe for concurrent use.
package spillway
