package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed concurrency_acquire.lua
var concurrencyAcquireSrc string

// ConcurrencyAcquire admits one request into a per-key in-flight sorted set
// (Stripe's concurrent-request limiter). See concurrency_acquire.lua for
// KEYS, ARGV and the reply. Release is a plain ZREM of the request id.
var ConcurrencyAcquire = redis.NewScript(concurrencyAcquireSrc)
