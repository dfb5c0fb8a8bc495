package ratelimit

import "time"

// Option configures a store. The same options serve both stores; an option
// that does not apply to a store is ignored by it (as documented on each).
type Option func(*storeOptions)

type storeOptions struct {
	clock   func() time.Time // nil: memory uses time.Now, Redis uses the server's TIME
	prefix  string
	maxKeys int
	shards  int
	// coalesce: calls in flight before the Redis store coalesces; 0: off
	coalesce int
	// settleQueue: the bound of the Redis store's queue of settles, in items; 0: the default
	settleQueue int
}

func defaultStoreOptions() storeOptions {
	return storeOptions{prefix: "spillway:", maxKeys: 1 << 20, shards: 64, coalesce: DefaultCoalescing}
}

// WithClock sets the clock. For the memory store it replaces the default
// clock (the wall time at construction plus the monotonic time since). For
// the Redis store it makes the client send its own time to the scripts
// instead of the scripts reading Redis TIME: for tests, and for managed
// Redis that rejects TIME in scripts. Every client of one Redis must then
// have synchronized clocks.
func WithClock(now func() time.Time) Option { return func(o *storeOptions) { o.clock = now } }

// WithPrefix sets the prefix of every Redis key (default "spillway:"). It
// must not contain '{' or '}'. Ignored by the memory store.
func WithPrefix(prefix string) Option { return func(o *storeOptions) { o.prefix = prefix } }

// WithMaxKeys caps the number of keys the memory store holds (default
// 1<<20; n ≤ 0 means the default); past the cap it evicts full or expired
// state first (see MemoryStore). Ignored by the Redis store, whose keys all
// carry TTLs.
func WithMaxKeys(n int) Option { return func(o *storeOptions) { o.maxKeys = n } }

// WithShards sets the number of lock shards of the memory store (default
// 64, rounded up to a power of two, lowered so every shard holds at least
// one key; n ≤ 0 means the default). Ignored by the Redis store.
func WithShards(n int) Option { return func(o *storeOptions) { o.shards = n } }
