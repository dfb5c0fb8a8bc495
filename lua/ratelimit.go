package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The request-rate scripts of ratelimit.RedisStore. Their contracts (KEYS,
// ARGV, reply, writes) open each .lua file. Every script that reads a
// bucket starts with the hold helpers of ratelimit_holds.lua.
var (
	//go:embed ratelimit_batch.lua
	ratelimitBatchSrc string
	//go:embed ratelimit_token_bucket.lua
	ratelimitTokenBucketSrc string
	//go:embed ratelimit_buckets.lua
	ratelimitBucketsSrc string
	//go:embed ratelimit_refund.lua
	ratelimitRefundSrc string
	//go:embed ratelimit_holds.lua
	ratelimitHoldsSrc string
	//go:embed ratelimit_hold.lua
	ratelimitHoldSrc string
	//go:embed ratelimit_settle.lua
	ratelimitSettleSrc string
	//go:embed ratelimit_subwindows.lua
	ratelimitSubwindowsSrc string
	//go:embed ratelimit_fixed.lua
	ratelimitFixedSrc string
)

var rateLimitBatch = redis.NewScript(ratelimitHoldsSrc + ratelimitSubwindowsSrc + ratelimitBatchSrc)

// RateLimitBatch decides N (key, policy, cost) items of every algorithm all
// or nothing in one call (ratelimit_batch.lua).
func RateLimitBatch() *redis.Script { return rateLimitBatch }

var rateLimitTokenBucket = redis.NewScript(ratelimitHoldsSrc + ratelimitTokenBucketSrc)

// RateLimitTokenBucket decides one token-bucket / GCRA / leaky-bucket item:
// the lean common path (ratelimit_token_bucket.lua).
func RateLimitTokenBucket() *redis.Script { return rateLimitTokenBucket }

var rateLimitBuckets = redis.NewScript(ratelimitHoldsSrc + ratelimitBucketsSrc)

// RateLimitBuckets decides N items of the bucket family (token bucket, GCRA,
// leaky bucket) all or nothing in one call, with a smaller ARGV and reply
// than RateLimitBatch: the lean path of a multi-item batch
// (ratelimit_buckets.lua).
func RateLimitBuckets() *redis.Script { return rateLimitBuckets }

var rateLimitFixed = redis.NewScript(ratelimitFixedSrc)

// RateLimitFixed decides N fixed-window items all or nothing in one call
// with the state, decisions and writes of RateLimitBatch, but one MGET, a
// small ARGV and one reply value per item: the lean path of a batch of
// fixed windows (ratelimit_fixed.lua).
func RateLimitFixed() *redis.Script { return rateLimitFixed }

var rateLimitRefund = redis.NewScript(ratelimitHoldsSrc + ratelimitSubwindowsSrc + ratelimitRefundSrc)

// RateLimitRefund undoes what RateLimitBatch or RateLimitBuckets charged,
// for the Redis Cluster (Ring) path where one slot group was charged and
// another denied: it restores the state from before the charge when the
// key still holds what the charge wrote (ratelimit_refund.lua).
func RateLimitRefund() *redis.Script { return rateLimitRefund }

var rateLimitHold = redis.NewScript(ratelimitHoldsSrc + ratelimitHoldSrc)

// RateLimitHold reserves N bucket-family items all or nothing and holds
// their estimates under one hold id (ratelimit_hold.lua).
func RateLimitHold() *redis.Script { return rateLimitHold }

var rateLimitSettle = redis.NewScript(ratelimitHoldsSrc + ratelimitSettleSrc)

// RateLimitSettle replaces holds by their actual costs, at most once per
// hold, or cancels the holds of a Cluster reserve whose other slot group
// was denied (ratelimit_settle.lua).
func RateLimitSettle() *redis.Script { return rateLimitSettle }
