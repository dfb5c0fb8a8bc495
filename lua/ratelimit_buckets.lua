-- ratelimit_buckets.lua: decide N token-bucket / GCRA / leaky-bucket items
-- all or nothing in one call: the lean path of ratelimit.RedisStore for a
-- batch (one Cluster slot group) whose items are all of the bucket family.
-- Same arithmetic as ratelimit_token_bucket.lua, ratelimit_batch.lua and
-- ratelimit/algorithms.go (bucketDecide), with a smaller ARGV and reply.
--
-- KEYS[i]  the state key of item i: a string holding the theoretical
--          arrival time TAT in integer µs (absent = full bucket). All keys
--          of one call hash to one Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2 + 3(i-1) .. 4 + 3(i-1)], for item i:
--          T    the emission interval ceil(Period/Limit) in µs (≥ 1)
--          tau  Burst·T in µs, the capacity in time (≤ 2^52)
--          n    the cost (≥ 0; 0 peeks; ≤ Burst+1 ≤ 2^52+1, exact: Go sends a larger cost as Burst+1)
--
-- Reply: an array of 1 + 2N integers {now, wait_1 .. wait_N, tat_1 ..
-- tat_N}:
--   now     the µs time the call decided at (before the per-item clamp)
--   wait_i  in [0, tau_i]: max(TAT, now') − now' for item i, where TAT
--           includes the charges of the earlier items of this call on the
--           same key that had room (as ratelimit_batch.lua does). The
--           caller derives each decision from it exactly as for
--           ratelimit_token_bucket.lua (need = wait + n·T; the item has
--           room iff n·T ≤ tau and need ≤ tau), and the batch is allowed
--           iff every item has room.
--   tat_i   that TAT itself (0: no state): what a Cluster refund restores
--           (ratelimit_refund.lua); with now, the caller recomputes the TAT'
--           the item wrote.
--
-- Writes: only when every item has room, for each item with n > 0:
-- SET KEYS[i] TAT' PX ceil(need/1000), TAT' = now' + need, in call order
-- (a repeated key keeps its last charge, which includes the earlier ones).
-- A denied batch writes nothing. now' is now clamped, per item, to
-- TAT − tau, the earliest time the state proves was seen (time going
-- backwards). A key of another type or content reads as a full bucket and
-- is overwritten. Redis formats a number argument with up to 17
-- significant digits, so the 16-digit µs TAT' goes through exactly.
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end

-- MGET reads the keys (false for a missing key or one of another type),
-- in chunks that unpack fits on Lua's stack
local cur = {}
for j = 1, #KEYS, 1000 do
  local part = redis.call('MGET', unpack(KEYS, j, math.min(j + 999, #KEYS)))
  for k = 1, #part do cur[j + k - 1] = part[k] end
end
local pending = {} -- key -> TAT an earlier item of this call charged
local N = #KEYS
local reply = {now}
local all = true
local wk, wv, wp = {}, {}, {} -- writes: key, TAT', PX
for i = 1, #KEYS do
  local key = KEYS[i]
  local b = 3 * i - 1
  local T = tonumber(ARGV[b])
  local tau = tonumber(ARGV[b + 1])
  local n = tonumber(ARGV[b + 2])
  local tat = pending[key]
  if tat == nil then tat = tonumber(cur[i]) or 0 end
  local t = now
  if t < tat - tau then t = tat - tau end
  local wait = 0
  if tat > t then wait = tat - t end
  local need = wait + n * T
  if need <= tau then
    if n > 0 then
      pending[key] = t + need
      local j = #wk + 1
      wk[j], wv[j], wp[j] = key, t + need, math.floor((need + 999) / 1000)
    end
  else
    all = false
  end
  reply[1 + i] = wait
  reply[1 + N + i] = tat
end

if all then
  for j = 1, #wk do
    redis.call('SET', wk[j], wv[j], 'PX', wp[j])
  end
end
return reply
