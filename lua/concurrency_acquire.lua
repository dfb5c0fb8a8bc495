-- concurrency_acquire.lua: admit one request of cost c into a per-key
-- in-flight set (Stripe's concurrent-request limiter, weighted by cost).
--
-- KEYS[1]  sorted set: one member per unit in flight, score = the start
--          time (µs) of the request that holds it. A request of cost c
--          holds c members with one score: its id, then id#1 … id#(c-1)
--          (so cost 1 is the bare id, as before costs existed).
-- ARGV[1]  limit L (integer >= 1): at most L unexpired members (units)
-- ARGV[2]  ttl in milliseconds (integer >= 1): a member older than this is
--          a leak (its server crashed before releasing) and is reaped
-- ARGV[3]  request id (unique per admission, no '#')
-- ARGV[4]  now in µs from the client clock, or "" to read Redis TIME
-- ARGV[5]  cost c (integer, 1 <= c <= L)
--
-- Reply: {allowed (0|1), in_flight, wait_ms}
--   allowed   1 when the request was admitted (its c members added, or the
--             id already present: a retried call adds nothing)
--   in_flight units after this call (members; the new ones included when
--             allowed)
--   wait_ms   when denied: ms until enough members are reaped for c units
--             to fit (an upper bound on the wait when no request
--             releases); 0 when allowed
--
-- Writes: reaps members with score <= now - ttl on every call; when allowed
-- adds the request's members and sets PEXPIRE ttl on the key, so an idle
-- key vanishes once every member would have been reaped. A denial writes
-- nothing else. Release is a plain ZREM of the request's c members.
--
-- Why c members and not one member carrying its cost: the count of units
-- stays ZCARD (O(1)) instead of a sum over every member on each call; a
-- request's members share one score, so the reap frees all c units of a
-- crashed request at once; the wait is one ZRANGE at a rank; and cost 1 is
-- the same commands as before. The price is one member per unit, at most L
-- per key.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local ttl_ms = tonumber(ARGV[2])
local id = ARGV[3]
local cost = tonumber(ARGV[5])
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
if n + cost <= limit then
  local added
  if cost == 1 then
    -- Re-adding a live id keeps one member: the caller's ids are unique,
    -- and ZADD NX makes a retried call harmless.
    added = redis.call("ZADD", key, "NX", int(now), id)
  elseif redis.call("ZSCORE", key, id) then
    added = 0 -- a retried call: the request is already in
  else
    local score = int(now)
    added = redis.call("ZADD", key, "NX", score, id)
    -- In chunks: Lua's unpack is bounded by the C stack (8000 slots).
    local i = 1
    while i < cost do
      local args = {}
      local j = math.min(i + 999, cost - 1)
      for u = i, j do
        args[#args + 1] = score
        args[#args + 1] = id .. "#" .. u
      end
      added = added + redis.call("ZADD", key, "NX", unpack(args))
      i = j + 1
    end
  end
  redis.call("PEXPIRE", key, ttl_ms)
  return {1, n + added, 0}
end
-- Denied: n + cost - limit members must go, the oldest first; the wait is
-- until the last of them (by rank) is reaped.
local need = n + cost - limit
local m = redis.call("ZRANGE", key, need - 1, need - 1, "WITHSCORES")
local wait_us = tonumber(m[2]) + ttl_us - now
local wait_ms = math.floor((wait_us + 999) / 1000)
if wait_ms < 1 then wait_ms = 1 end
return {0, n, wait_ms}
