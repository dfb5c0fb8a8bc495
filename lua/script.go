package lua

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// scripts are the scripts by the name of their main file.
var scripts = map[string]*redis.Script{
	"ceiling_charge":         ceilingCharge,
	"ceiling_refund":         ceilingRefund,
	"concurrency_acquire":    concurrencyAcquire,
	"ratelimit_batch":        rateLimitBatch,
	"ratelimit_buckets":      rateLimitBuckets,
	"ratelimit_fixed":        rateLimitFixed,
	"ratelimit_hold":         rateLimitHold,
	"ratelimit_refund":       rateLimitRefund,
	"ratelimit_settle":       rateLimitSettle,
	"ratelimit_token_bucket": rateLimitTokenBucket,
	"shedder_fleet":          shedderFleet,
}

// Script returns the script whose main file is name+".lua" (for example
// "ratelimit_hold" for ratelimit_hold.lua, with the hold helpers it
// starts with). Each script is built once; run it with go-redis
// Script.Run (EVALSHA, with an EVAL fallback on NOSCRIPT). Its contract
// opens its .lua file. A name no script has is a programming error:
// Script panics with a message that names it and the scripts there are.
func Script(name string) *redis.Script {
	s, ok := scripts[name]
	if !ok {
		panic(fmt.Sprintf("lua: no script %q (the scripts: %s)", name, strings.Join(slices.Sorted(maps.Keys(scripts)), ", ")))
	}
	return s
}
