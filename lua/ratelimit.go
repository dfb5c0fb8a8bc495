package lua

import (
	_ "embed"
	"regexp"
	"strconv"
	"strings"

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

// rateLimitBatch decides N (key, policy, cost) items of every algorithm all
// or nothing in one call (ratelimit_batch.lua).
var rateLimitBatch = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitSubwindowsSrc + ratelimitBatchSrc))

// rateLimitTokenBucket decides one token-bucket / GCRA / leaky-bucket item:
// the lean common path (ratelimit_token_bucket.lua).
var rateLimitTokenBucket = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitTokenBucketSrc))

// rateLimitBuckets decides N items of the bucket family (token bucket, GCRA,
// leaky bucket) all or nothing in one call, with a smaller ARGV and reply
// than RateLimitBatch: the lean path of a multi-item batch
// (ratelimit_buckets.lua).
var rateLimitBuckets = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitBucketsSrc))

// rateLimitFixed decides N fixed-window items all or nothing in one call
// with the state, decisions and writes of RateLimitBatch, but one MGET, a
// small ARGV and one reply value per item: the lean path of a batch of
// fixed windows (ratelimit_fixed.lua).
var rateLimitFixed = redis.NewScript(ratelimitFixedSrc)

// rateLimitRefund undoes what RateLimitBatch or RateLimitBuckets charged,
// for the Redis Cluster (Ring) path where one slot group was charged and
// another denied: it restores the state from before the charge when the
// key still holds what the charge wrote (ratelimit_refund.lua).
var rateLimitRefund = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitSubwindowsSrc + ratelimitRefundSrc))

// rateLimitHold reserves N bucket-family items all or nothing and holds
// their estimates under one hold id (ratelimit_hold.lua).
var rateLimitHold = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitHoldSrc))

// rateLimitSettle replaces holds by their actual costs, at most once per
// hold, or cancels the holds of a Cluster reserve whose other slot group
// was denied (ratelimit_settle.lua).
var rateLimitSettle = redis.NewScript(slotted(ratelimitHoldsSrc + ratelimitSettleSrc))

var (
	slotLine  = regexp.MustCompile(`(?m)^--   slots \w+: (.+)$`)
	constLine = regexp.MustCompile(`(?m)^--   consts: (.+)$`)
	slotRef   = regexp.MustCompile(`\[[A-Z][A-Z0-9_]*\]`)
	nameRef   = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*\b`)
)

// slotted writes each [NAME] of src whose NAME is a slot, named on a line
// "--   slots x: NAME NAME …" of src, as its slot number (1, 2, … in the
// order the line lists them), and each NAME declared on a line
// "--   consts: NAME=value …" as its value (the declaring lines are kept):
// the named slots and numbers of ratelimit_holds.lua, which cost a
// script nothing when it runs. A name that is not declared is left as it
// is (and fails when the script runs: no such global).
func slotted(src string) string {
	slot, value := map[string]string{}, map[string]string{}
	for _, m := range slotLine.FindAllStringSubmatch(src, -1) {
		for i, name := range strings.Fields(m[1]) {
			slot[name] = "[" + strconv.Itoa(i+1) + "]"
		}
	}
	for _, m := range constLine.FindAllStringSubmatch(src, -1) {
		for _, f := range strings.Fields(m[1]) {
			if name, v, ok := strings.Cut(f, "="); ok {
				value[name] = v
			}
		}
	}
	lines := strings.SplitAfter(src, "\n")
	for i, l := range lines {
		if slotLine.MatchString(l) || constLine.MatchString(l) {
			continue
		}
		l = slotRef.ReplaceAllStringFunc(l, func(ref string) string {
			if n, ok := slot[ref[1:len(ref)-1]]; ok {
				return n
			}
			return ref
		})
		if len(value) > 0 {
			l = nameRef.ReplaceAllStringFunc(l, func(name string) string {
				if v, ok := value[name]; ok {
					return v
				}
				return name
			})
		}
		lines[i] = l
	}
	return strings.Join(lines, "")
}
