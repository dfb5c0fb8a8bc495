// Package fallback keeps rate limiting up when its shared store is not:
// Redis trouble never takes the API down and never lets a spike through
// unchecked.
//
// NewStore wraps a ratelimit.Store (a RedisStore) and is itself a
// ratelimit.Store, so ratelimit.Limiter and tiers use it transparently.
// NewLimiter wraps any spillway.Limiter whose backend may fail. Both add:
//
//   - a time budget per call (default 50ms): a slow Redis costs at most the
//     budget (the client must honour context deadlines: TuneOptions);
//   - a circuit breaker (sony/gobreaker, two-step) that opens after K
//     consecutive failures (default 5), so that while Redis is down no
//     request waits on it, and closes again after Probes successful
//     half-open probes; the caller's own cancellation is not a failure;
//   - a local share: while the breaker is open and on any failed call,
//     decisions come from a local memory store with every policy scaled to
//     Share of its quota (default 20%), marked Degraded; N servers admit at
//     most N × Share of the quota during an outage;
//   - fail-open or fail-closed per scope (Settings.Mode); fail-closed denies
//     with spillway.ReasonFailClosed.
//
// The Store adds a cache of denials (a key Redis denied until T is denied
// locally until T, without a round trip) and reconcile (after an outage the
// local consumption of the last Period is charged back to Redis, so an
// outage is no free refill); see Store. Over a RedisStore it is also a
// ratelimit.Reserver: reservations (reserve, then settle the actual cost)
// are held by Redis, or by the local share while Redis cannot answer; see
// Store.Reserve.
//
// Shortest use:
//
//	opt := &redis.Options{Addr: "localhost:6379"}
//	fallback.TuneOptions(opt)
//	store, err := fallback.NewStore(ratelimit.NewRedisStore(redis.NewClient(opt)), fallback.Settings{})
//	if err != nil { … }
//	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 100, Period: time.Second})
//
// Stores and Limiters are safe for concurrent use.
package fallback
