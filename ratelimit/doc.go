// Package ratelimit limits the request rate of keys (IPs, users, API keys)
// with one of seven algorithms over a Store: a sharded in-process
// MemoryStore, or a RedisStore shared by a fleet.
//
// Each constructor takes its own settings struct, whose zero value is the
// default: New a Settings, NewMemoryStore a MemorySettings, NewRedisStore
// a RedisSettings. A field of one cannot be passed to another.
//
// The shortest use:
//
//	store := ratelimit.NewMemoryStore(ratelimit.MemorySettings{})
//	lim, err := ratelimit.New(store, ratelimit.Policy{Limit: 100, Period: time.Second}, ratelimit.Settings{})
//	if err != nil { return err }                // the policy is invalid
//	d, err := lim.Allow(ctx, clientIP, 1)
//	if err == nil && !d.Allowed {
//		// answer 429 with Retry-After: d.RetryAfter
//	}
//
// To put it in a spillway.Chain, key it by a request dimension:
// ratelimit.PerKey(lim, spillway.DimIP).
//
// # Algorithms
//
// See Algorithm for the exact arithmetic, shared by both stores: integer
// microseconds, the same formulas in Go (algorithms.go) and in the Redis
// scripts. TokenBucket, GCRA and LeakyBucket keep one integer per key (the
// theoretical arrival time); FixedWindow a window and a count;
// SlidingWindowCounter a window and two counts; SlidingWindowBuckets a
// sub-window index and Buckets+1 counts (a sliding window in N sub-windows,
// conservative or interpolated); SlidingWindowLog one timestamp per
// admitted unit.
//
// # Decisions
//
// Limit is Policy.Capacity; Remaining what is left after the decision;
// ResetAfter the time until the key's state is back to full; RetryAfter,
// on a denial, when the same request can succeed. Durations are computed in
// microseconds and reported rounded UP to whole milliseconds, so a caller
// that waits RetryAfter is never early. A denial has Reason
// spillway.ReasonRateLimited, or spillway.ReasonCostExceedsLimit with
// RetryAfter 0 when the cost exceeds Capacity and can never succeed.
// Decision.Limiter is the limiter's scope. Schedule and Wait smooth the
// bucket family: a request is admitted as Allow would admit it, and the
// delay says when its turn comes.
//
// # Errors and outages
//
// A denial is a decision, never an error. Allow returns an error only for
// a negative cost (wrapping ErrInvalidCost) or when the store failed; New
// only for a nil store or an invalid policy (wrapping ErrInvalidPolicy,
// naming the field). A RedisStore alone returns Redis's errors; behind
// fallback.NewStore the decisions are made locally at this server's share
// of the limit while Redis cannot answer (marked Degraded), or denied when
// Settings.FailMode is spillway.FailClosed.
//
// # Batches
//
// Store.Decide takes several (scope, key, policy, cost) items and decides
// them all or nothing: when one is denied, none is charged. Tiers use it to
// check a per-IP, a per-user and a per-endpoint limit in one step (one
// Redis round trip).
//
// # Reserve, then settle
//
// A cost known only after the work (tokens generated, bytes streamed)
// holds an estimate and settles the actual cost:
//
//	h, err := lim.Reserve(ctx, apiKey, 2000) // decided like Allow(2000)
//	if err == nil && h.Decision().Allowed {
//		n := generate()
//		res, err := h.Settle(ctx, n) // a refund, or an extra charge into debt
//	}
//
// Only the bucket family holds (the windows return ErrHoldUnsupported). An
// extra charge may put the key up to one Burst into debt, so the next
// requests wait. A hold not settled within its TTL (Settings.HoldTTL) is released
// by the store on the next touch of its key; a settle is applied at most
// once per hold, also when retried after a timeout (SettleAlreadySettled).
// A store's Reserve holds a batch all or nothing. See docs/ratelimit.md.
//
// # Concurrency
//
// Limiter, MemoryStore, RedisStore and Hold are safe for concurrent use.
package ratelimit
