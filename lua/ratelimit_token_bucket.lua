-- ratelimit_token_bucket.lua: one token-bucket / GCRA / leaky-bucket
-- decision, the lean common path of ratelimit.RedisStore (a single item of
-- the bucket family). Same arithmetic as ratelimit_batch.lua and
-- ratelimit/algorithms.go (bucketDecide).
--
-- KEYS[1]  the state key: a string holding the theoretical arrival time TAT
--          in integer µs (absent = full bucket)
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  T, the emission interval ceil(Period/Limit) in µs (≥ 1)
-- ARGV[3]  tau = Burst·T in µs, the capacity in time (≤ 2^53)
-- ARGV[4]  n, the cost (≥ 0; 0 peeks)
--
-- Reply: {ok, remaining, reset, retry}, integers
--   ok         1 if allowed (and charged); a peek is always allowed
--   remaining  what is left after this call
--   reset      µs until the bucket is full again (also the key's TTL)
--   retry      µs until n fits; 0 when allowed, and 0 with ok = 0 when
--              n·T > tau (n above the burst: it never fits)
--
-- Writes: only when allowed with n > 0: SET KEYS[1] TAT' PX ceil(reset/1000)
-- (≥ 1 ms; at its end the bucket is full and no key means the same). A
-- denial writes nothing. Time going backwards is clamped to TAT - tau, the
-- earliest time the state proves was seen. TAT' is formatted with %d:
-- Lua's default %.14g would round a 16-digit µs time.
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
if now < 0 then now = 0 end
local T = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local tat = tonumber(redis.pcall('GET', KEYS[1])) or 0
if now < tat - tau then now = tat - tau end
if tat < now then tat = now end
local wait = tat - now
local need = wait + n * T
if need > tau or n == 0 then
  local retry = need - tau
  if n * T > tau or retry < 0 then retry = 0 end
  return {n == 0 and 1 or 0, math.floor((tau - wait) / T), wait, retry}
end
redis.call('SET', KEYS[1], string.format('%d', now + need), 'PX', math.floor((need + 999) / 1000))
return {1, math.floor((tau - need) / T), need, 0}
