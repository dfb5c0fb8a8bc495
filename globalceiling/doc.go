// Package globalceiling puts a fleet-wide ceiling in front of one shared
// resource — the database, typically — so that the fleet as a whole never
// sends it more than Limit units of work per Window.
//
// A global ceiling is load shedding, not per-client fairness: it protects
// the resource from the sum of all traffic and does not care who sent it.
// Put per-client limits (ratelimit, concurrency) in front of it so one
// client cannot use the whole ceiling. It honors priorities: Sheddable and
// SheddablePlus work is refused once the total reaches (1 − Reserve) ×
// Limit, keeping the rest for Critical and CriticalPlus work (Settings.Reserve).
// A denial has Reason spillway.ReasonCeiling (answer 503) and a RetryAfter
// of the time until the window ends.
//
// # Sharded counter
//
// One counter key would put every request of the fleet on one Redis slot
// and node. The ceiling keeps K shard counters per window (Settings.Shards,
// default 8), each with its own hash tag ("{orders-db:0}" …
// "{orders-db:7}"), so on a Cluster they spread over slots and nodes; each
// admission charges one shard chosen at random. Windows are fixed,
// aligned to the Unix epoch and numbered by the servers' clocks (the key
// names the window, and a script may touch only the keys it is given):
// a server whose clock is off by s counts its admissions s early or late.
//
// # Modes and their bounds
//
// N is the number of servers, T the sync interval (default 100 ms), r the
// most one server admits per second, and "admitted per window" counts cost
// units.
//
//   - Exact: charge one shard and read the other K−1 in one pipeline (one
//     round trip); on denial, refund the charge (a second round trip, on
//     the denial path only). On a single Redis node the pipeline's charge
//     runs before its reads, so every admission sees every charge that
//     landed before its own: admitted per window ≤ Limit, no overshoot
//     (concurrent denied charges can make a few admissions near the
//     ceiling fail early: undershoot). On a Cluster the reads on other
//     nodes may run before the charge lands, so two concurrent admissions
//     can miss each other: overshoot ≤ the number of admissions in flight
//     at the moment the ceiling is crossed.
//   - Cached: decide on the total read at the last sync plus this server's
//     own admissions since, then charge one shard (one round trip, one
//     write). Other servers' admissions are invisible for up to T, so
//     admitted per window ≤ Limit + (N−1)·r·T.
//   - LocalAggregation: decide like Cached without a round trip; every T
//     flush the local count to one shard and read the total in one
//     pipeline. Another server's admission is invisible for up to 2T
//     (until it flushes, then until we read), so admitted per window ≤
//     Limit + (N−1)·r·2T, with one write per server per T instead of one
//     per admission.
//
// Cached and LocalAggregation run a background goroutine (stop it with
// Close); when no sync has succeeded for Settings.StaleAfter (default 5T) their
// admissions fail with an error wrapping ErrStale.
//
// # Guarding a database pool
//
// Guard admits before the work asks the pool for a connection and rejects
// at once (never queues holding a connection) with a *RejectedError that
// matches ErrCeilingReached, names the block that denied and carries
// RetryAfter. DB wraps a *sql.DB. The ceiling falls back by itself: while
// Redis cannot answer it decides at this server's share of the fleet it
// last saw alive (the whole ceiling on a lone server), marked Degraded. A
// ceiling is a rate; "at most N database calls in flight across the
// fleet" is concurrency.NewInFlight, which a Guard takes as well.
//
// The shortest use:
//
//	import "github.com/redis/go-redis/v9"
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	ceil, err := globalceiling.New(rdb, "orders-db", 5000, time.Second, globalceiling.Settings{})
//	if err != nil { return err }
//	defer ceil.Close()
//	guard, _ := globalceiling.NewGuard(ceil)
//	err = guard.Do(ctx, nil, func(ctx context.Context) error {
//		_, err := db.ExecContext(ctx, "UPDATE …")
//		return err
//	})
//	if errors.Is(err, globalceiling.ErrCeilingReached) { /* 503, Retry-After */ }
//
// New is configured by one Settings struct (its zero value is the
// default); it fails with an error naming the field out of range. Ceiling,
// Guard and DB are safe for concurrent use.
package globalceiling
