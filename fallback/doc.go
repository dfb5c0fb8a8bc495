// Package fallback keeps rate limiting up when its shared store is not:
// Redis trouble never takes the API down and never lets a spike through
// unchecked.
//
// NewHealth attaches one health to a Redis client: every block on the
// client then falls back by itself. The concurrency limiter, the global
// ceiling and the fleet shedder do so on their own; a rate-limit store goes
// through NewStore, which wraps a ratelimit.Store (a RedisStore) and is
// itself a ratelimit.Store, so ratelimit.Limiter and tiers use it
// transparently (it finds the client's health by itself). It adds:
//
//   - a time budget per call (default 50ms), the fallback's own deadline
//     whatever the client's socket options: a slow or hung Redis costs at
//     most the budget (NewHealth makes the client honour context
//     deadlines; calls whose client cannot be reached run detached, see
//     MaxAbandoned);
//   - a circuit breaker (sony/gobreaker, two-step) that opens after K
//     consecutive failures (default 5), so that while Redis is down no
//     request waits on it; the health's own probe (a PING about once a
//     second, off the request path) closes it again after Probes
//     successes; the caller's own cancellation is not a failure;
//   - a local share: while the breaker is open and on any failed call,
//     decisions come from a local memory store with every policy scaled to
//     this server's share of the fleet it last saw alive (1/N for the N
//     servers the fleet shedder on the client counted, at least 0.05: a
//     lone server keeps its whole limit; 0.2 before any count;
//     HealthSettings.Share fixes it), marked Degraded;
//   - fail-open or fail-closed per scope (Settings.Fail); fail-closed denies
//     with spillway.ReasonFailClosed.
//
// The Store adds a cache of denials (a key Redis denied until T is denied
// locally until T, without a round trip) and reconcile (after an outage the
// local consumption of the last Period is charged back to Redis, so an
// outage is no free refill); see Store. Over a RedisStore it holds
// reservations too (reserve, then settle the actual cost): by Redis, or
// by the local share while Redis cannot answer; see Store.Reserve.
//
// Errors: a Store's Decide returns an error only for invalid input or a
// caller that gave up (its context ended); Redis's errors and timeouts
// become local decisions marked Degraded (Cause ErrOpen, ErrAbandoned or
// the store's error in the DegradedEvent).
//
// Shortest use:
//
//	import "github.com/redis/go-redis/v9"
//
//	fallback.SetRedisLogger(nil, 0) // go-redis's own log: to slog, one line per pattern per 10 s
//	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	if _, err := fallback.NewHealth(client, fallback.HealthSettings{}); err != nil { // once, before the blocks
//		return err
//	}
//	redisStore, err := ratelimit.NewRedisStore(client, ratelimit.RedisSettings{})
//	if err != nil { return err }
//	store, err := fallback.NewStore(redisStore, fallback.Settings{})
//	if err != nil { return err }
//	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 100, Period: time.Second}, ratelimit.Settings{})
//
// Stores and Healths are safe for concurrent use.
package fallback
