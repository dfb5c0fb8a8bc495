package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed concurrency_acquire.lua
var concurrencyAcquireSrc string

// concurrencyAcquire admits one request of cost c into a per-key in-flight
// sorted set (Stripe's concurrent-request limiter, weighted): the request
// holds c members, its id and id#1 … id#(c-1). See concurrency_acquire.lua
// for KEYS, ARGV and the reply. Release is a plain ZREM of those members.
var concurrencyAcquire = redis.NewScript(concurrencyAcquireSrc)
