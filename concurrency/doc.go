// Package concurrency limits how much work is in flight.
//
// Limiter is Stripe's concurrent-request limiter: at most L units of one
// key (a user, an API key, an endpoint) in flight across the whole fleet,
// where a request of cost c holds c units (one by default). Its state is a
// Redis sorted set per key — one member per unit, named after a unique
// request id, scored with the request's start time — changed by one Lua
// script (lua.Script("concurrency_acquire")) that reaps entries older than a TTL on
// every call, so a server that crashed mid-request leaks its units only
// until the TTL. MemoryStore is a twin with
// the same semantics for a single process and for tests; one conformance
// suite runs against both.
//
// On a RedisStore the Limiter falls back by itself: each acquire waits on
// Redis for at most what is left of the request's budget (spillway.Chain,
// or the adapters'; spillway.DefaultBudget without one), and while
// Redis cannot answer — a failure, the budget spent, the client's health
// open (fallback.NewHealth on the client stops every block's calls after
// K failures) — it decides locally at this server's share of the limit
// (its share of the fleet it last saw alive: the whole limit on a lone
// server), marked Degraded, or denies with spillway.ReasonFailClosed under
// Settings{FailMode: spillway.FailClosed}. Nothing to wire: no local twin,
// no wrapper. NewInFlight is the fleet-wide cap "at most N in flight" (one
// key, 503 when full).
//
// LatencyLimit learns how much work a server may have in flight at a
// dependency from the latency of the work it completes (windows of
// samples against a learned baseline, slow start, gentle probes after a
// cut, fast cuts on a collapse, failures or overdue work). It is meant to
// size a shedder.Pool, a queue in priority order whose slots it sets,
// capped by what the fleet shedder allows the server; it also drives
// Adaptive, a local limit that turns work away at once. NewAIMD is the
// other Algorithm, for work whose latency says nothing about overload
// (requests of very different sizes): it learns from failures only.
//
// What is counted: a Limiter counts units (a request of cost c holds c
// units, cost 0 is 1); Adaptive counts requests whatever their cost. What
// is guaranteed: while the store answers, a key never has more than its
// limit in flight across everything that shares the store (while Redis
// cannot answer, each server holds to its share), and a done releases
// exactly once; an entry not released within the TTL (a crash) is reaped. A denial is a Decision, not an error: a
// Limiter's has spillway.ReasonConcurrency (429), NewInFlight's
// spillway.ReasonCeiling (503), Adaptive's spillway.ReasonShed (503). An
// error means a negative cost or a caller that canceled (a
// *spillway.StoreError then): a store that cannot answer is decided
// locally, as above, never an error.
//
// Each constructor takes a settings struct of its own (Settings,
// MemorySettings, RedisSettings, LatencyConfig, AIMDConfig), whose zero
// value is the default; time is injected through the stores' Clock field.
//
// The shortest use:
//
//	import "github.com/redis/go-redis/v9"
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	store, err := concurrency.NewRedisStore(rdb, concurrency.RedisSettings{})
//	if err != nil { return err }
//	lim, err := concurrency.New(store, 20, concurrency.Settings{}) // at most 20 in flight per key
//	if err != nil { return err }
//	d, done, err := lim.Acquire(ctx, userID, 1) // cost 1
//	if err == nil && d.Allowed {
//		defer done(spillway.Success)
//		// work
//	}
//
// or, as a spillway.Limiter keyed by a request dimension,
// concurrency.PerKey(lim, spillway.DimUser).
//
// Every type in this package is safe for concurrent use, except the
// Algorithms (a LatencyLimit alone), which Adaptive and shedder.Pool call
// under their own lock.
package concurrency
