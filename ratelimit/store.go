package ratelimit

import (
	"context"
	"time"

	"github.com/spillway-go/spillway"
)

// Item is one (key, policy, cost) to decide. Scope names the rule or limiter
// the key belongs to (so two rules that limit the same IP keep separate
// state); Key is the entity (an IP, a user id, an API key). Stores build the
// physical key from both in one place (see the package doc): user-supplied
// Key values cannot choose a Redis Cluster slot or collide with another
// scope, and long values are hashed. Items that share a Key share a hash tag.
//
// Fail is what the item's limit wants when the store cannot answer. The
// memory and Redis stores ignore it; a store that decides on failures (a
// fallback.Store) honours it per item, so a fail-closed rule fails closed
// whatever else is in the batch.
type Item struct {
	Scope  string
	Key    string
	Policy Policy
	Cost   int64             // 0 peeks: allowed, charges nothing
	Fail   spillway.FailMode // what the limit wants when the store is unavailable
	// Fixed, in a store's Reserve, charges Cost at admission, as Decide
	// would, with the batch's other items (all or nothing), and holds
	// nothing for it: the hold's settle leaves it as it is and reports
	// SettleApplied (a cancel of a Cluster batch that another slot
	// group denied gives it back). Cheaper than a hold: use it for the
	// items whose cost is known up front. Decide ignores it.
	Fixed bool
}

// Store decides batches of items. Both stores implement the same semantics,
// so the memory store is the oracle for the Redis scripts.
type Store interface {
	// Decide decides items together, all or nothing: if any item is
	// denied, none is charged. It writes one decision per item into
	// out[:len(items)] (out must be at least that long) and reports whether
	// the whole batch was allowed. Each item's decision is what that item
	// alone would see: out[i].Allowed says whether it had room, and its
	// Remaining is counted as if it had been charged. When the batch is
	// denied nothing is written, whatever the allowed items report.
	// err != nil means the backend failed; nothing is charged then (a
	// Redis store that charged part of a Cluster batch refunds it).
	Decide(ctx context.Context, items []Item, out []spillway.Decision) (allowed bool, err error)

	// Reset forgets the state of (scope, key) under policy p (the policy
	// selects the algorithm's physical layout).
	Reset(ctx context.Context, scope, key string, p Policy) error
}

// boundedStore is a Store that bounds one Decide by a deadline given
// apart from the context. A wrapper that gives every call a time budget
// (fallback.Store) calls DecideBy with the budget's end instead of making a
// context with that deadline: such a context costs a timer per call,
// which at tens of thousands of decisions per second is a measurable share
// of the client's CPU. RedisStore implements it.
type boundedStore interface {
	Store
	// DecideBy is Decide, bounded by deadline as well as by ctx: a call
	// still waiting at the deadline returns an error wrapping
	// context.DeadlineExceeded, exactly as if ctx had that deadline
	// (the zero deadline: no bound but ctx's).
	DecideBy(ctx context.Context, deadline time.Time, items []Item, out []spillway.Decision) (allowed bool, err error)
}

// scriptCost is the cost a Redis script is sent for it: Cost, or
// Capacity+1 when Cost is above the capacity. The script decides any cost
// above the capacity the same way (denied, nothing written), and
// Capacity+1 ≤ 2^52+1 is exact in its doubles, where a cost above 2^53
// would be rounded (2^53+1 became 2^53 and was admitted against a burst of
// 2^53). Validate bounds the capacity; the store's decision still reports
// the item's own cost as exceeding.
func (it *Item) scriptCost() int64 {
	if c := it.Policy.Capacity(); it.Cost > c {
		return c + 1
	}
	return it.Cost
}
