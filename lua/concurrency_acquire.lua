-- concurrency_acquire.lua: admit one request into a per-key in-flight set
-- (Stripe's concurrent-request limiter).
--
-- KEYS[1]  sorted set: member = request id, score = start time (µs)
-- ARGV[1]  limit L (integer >= 1): at most L unexpired members
-- ARGV[2]  ttl in milliseconds (integer >= 1): a member older than this is
--          a leak (its server crashed before releasing) and is reaped
-- ARGV[3]  request id (unique per admission)
-- ARGV[4]  now in µs from the client clock, or "" to read Redis TIME
--
-- Reply: {allowed (0|1), in_flight, wait_ms}
--   allowed   1 when the id was added
--   in_flight members after this call (including the new one when allowed)
--   wait_ms   when denied: ms until the oldest member is reaped (an upper
--             bound on the wait when no request releases); 0 when allowed
--
-- Writes: reaps members with score <= now - ttl on every call; when allowed
-- adds the id and sets PEXPIRE ttl on the key, so an idle key vanishes once
-- every member would have been reaped. A denial writes nothing else.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local ttl_ms = tonumber(ARGV[2])
local now
if ARGV[4] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[4])
end
local ttl_us = ttl_ms * 1000
-- Scores are µs since the epoch (16 digits): format them ourselves, since
-- older Redis versions turn Lua numbers into strings with 14 digits.
local function int(x) return string.format("%.0f", x) end

redis.call("ZREMRANGEBYSCORE", key, "-inf", int(now - ttl_us))
local n = redis.call("ZCARD", key)
if n < limit then
  -- Re-adding a live id keeps one member: the caller's ids are unique, and
  -- ZADD NX makes a retried call harmless.
  local added = redis.call("ZADD", key, "NX", int(now), ARGV[3])
  redis.call("PEXPIRE", key, ttl_ms)
  return {1, n + added, 0}
end
local oldest = redis.call("ZRANGE", key, 0, 0, "WITHSCORES")
local wait_us = tonumber(oldest[2]) + ttl_us - now
local wait_ms = math.floor((wait_us + 999) / 1000)
if wait_ms < 1 then wait_ms = 1 end
return {0, n, wait_ms}
