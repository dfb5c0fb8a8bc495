// Package concurrency limits how much work is in flight.
//
// Limiter is Stripe's concurrent-request limiter: at most L units of one
// key (a user, an API key, an endpoint) in flight across the whole fleet,
// where a request of cost c holds c units (one by default). Its state is a
// Redis sorted set per key — one member per unit, named after a unique
// request id, scored with the request's start time — changed by one Lua
// script (lua.ConcurrencyAcquire) that reaps entries older than a TTL on
// every call, so a server that crashed mid-request leaks its units only
// until the TTL. MemoryStore is a twin with
// the same semantics for a single process and for tests; one conformance
// suite runs against both.
//
// Adaptive is a local limit on a server's own concurrency (in requests,
// whatever their cost) that learns from latency and drops: AIMD, or Gradient (a latency-gradient algorithm with
// slow start and a min-RTT baseline re-measured by periodic probes, so it
// does not creep upward under steady overload).
//
// The shortest use:
//
//	store := concurrency.NewRedisStore(rdb)
//	lim, err := concurrency.New(store, 20) // at most 20 in flight per key
//	...
//	d, done, err := lim.Acquire(ctx, userID)
//	if err == nil && d.Allowed {
//		defer done(spillway.Success)
//		// work
//	}
//
// or, as a spillway.Limiter keyed by a request dimension,
// concurrency.PerKey(lim, spillway.DimUser).
//
// Every type in this package is safe for concurrent use, except the
// Algorithm implementations, which Adaptive calls under its own lock.
package concurrency
