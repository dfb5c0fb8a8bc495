package ratelimit

import (
	"time"

	"github.com/spillway-go/spillway"
)

// Settings configures a Limiter (New). The zero value is the default;
// each constructor of the package takes its own settings struct
// (Settings, MemorySettings, RedisSettings), so a field that does not
// apply to a constructor cannot be passed to it.
type Settings struct {
	// Scope names the limiter: the scope under which its keys live in the
	// store (two limiters with different scopes keep separate state for
	// the same key) and the Limiter field of its decisions. "" is the
	// default: a 6-character digest of the policy's String(), so that a default key in Redis is only a few bytes
	// longer than the user's key, and two limiters with the same policy on
	// the same store share state unless named; the decisions of an
	// unnamed limiter carry the policy's String() ("token_bucket 100/1s
	// burst 50"), readable where the digest is not.
	Scope string
	// FailMode is what the limiter wants when its store cannot answer
	// (default spillway.FailOpen). Every item it sends carries the mode,
	// so a fallback.Store under it honours it; without such a store, the
	// *spillway.StoreError its Admit returns carries it to the adapter.
	FailMode spillway.FailMode
	// HoldTTL is how long the limiter's holds (Reserve) live unsettled
	// before the store releases them (0: DefaultHoldTTL; else at least
	// 1ms, at most MaxHoldTTL). Make it longer than the longest piece of
	// work a hold covers: a hold released before its settle is not
	// charged at all.
	HoldTTL time.Duration
}

// MemorySettings configures a MemoryStore (NewMemoryStore). The zero
// value is the default.
type MemorySettings struct {
	// Clock replaces the default clock (the wall time at construction plus
	// the monotonic time since).
	Clock func() time.Time
	// MaxKeys caps the number of keys the store holds (≤ 0: 1<<20); past
	// the cap it evicts full or expired state first (see MemoryStore).
	MaxKeys int
	// Shards is the number of lock shards (≤ 0: 64), rounded up to a power
	// of two and lowered so that every shard holds at least one key.
	Shards int
}

// RedisSettings configures a RedisStore (NewRedisStore). The zero value
// is the default.
type RedisSettings struct {
	// Clock, when set, makes the client send its own time to the scripts
	// instead of the scripts reading Redis TIME: for tests, and for
	// managed Redis that rejects TIME in scripts. Every client of one
	// Redis must then have synchronized clocks.
	Clock func() time.Time
	// Prefix is the prefix of every Redis key ("": "spillway:"). It must
	// not contain '{' or '}'.
	Prefix string
	// Coalescing is how many script calls the store has in flight at once
	// before it coalesces (0: DefaultCoalescing; negative: off, every
	// Decide makes calls of its own).
	//
	// With coalescing, a Decide that finds fewer than n calls in flight
	// makes its call at once, exactly as without coalescing, so a lone
	// caller waits for nothing. One that finds n calls in flight queues;
	// when a call returns, everything queued meanwhile (up to 256 items)
	// goes out as one script call per slot group, in one pipeline: one
	// command for Redis to parse and run where there would have been one
	// per batch. No timer is involved: a batch waits at most for the call
	// in flight before it.
	//
	// Each queued batch is one group of the coalesced call, decided all or
	// nothing exactly as if it were a call of its own made after the
	// earlier groups: a denied batch charges nothing and changes nothing
	// another batch sees. Only batches whose items share one slot (on a
	// Cluster; one hash tag on a Ring) are coalesced; a batch over several
	// slots runs its own calls. A caller whose context ends while its
	// batch is queued returns ctx.Err() and its batch is never sent; once
	// sent, it returns ctx.Err() at once and the call goes on for the
	// others (the batch may then have been charged, as with any call
	// interrupted after it was sent).
	//
	// On a Cluster, each primary has its own n calls in flight and its own
	// queue: a batch waits only for calls to the node that serves its
	// slot, so a primary that stalls or dies holds up its own slots, not
	// the others'.
	Coalescing int
	// SettleQueue bounds the queue of settles on their way to Redis
	// (the settles tiers hands off the request path), in items (≤ 0: DefaultSettleQueue). A queued
	// item costs about 200 bytes besides its Hold, which the queue keeps
	// alive: 16384 items, about 3 MiB.
	SettleQueue int
}
