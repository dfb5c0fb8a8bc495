-- ratelimit_hold.lua: reserve, the first half of reserve-then-settle
-- (ratelimit.RedisStore.Reserve): decide N token-bucket / GCRA /
-- leaky-bucket items all or nothing and, when every item has room, hold
-- each item's estimate under one hold id until ratelimit_settle.lua
-- settles it or its TTL passes. The arithmetic is ratelimit/hold.go
-- (heldDecide) line by line; the helpers (hparse, hnow, hreap, hlast,
-- hwrite) and the layout of holds are ratelimit_holds.lua.
--
-- KEYS[2i-1]  item i's bucket key K: its TAT in µs, "<tat>" or, marked,
--             "<tat>h<n>:<last>" (absent = full bucket)
-- KEYS[2i]    K..":h", the holds of K (sorted set)
--             All keys hash to one Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  ttl, the holds' life in µs (1000 .. 2^51)
-- then, for item i, 4 values:
--          T       the emission interval in µs (≥ 1)
--          tau     Burst·T in µs (≤ 2^51)
--          n       the estimate (≥ 0; ≤ Burst+1, Go sends a larger one as
--                  Burst+1: denied as exceeding)
--          member  "<hold id>/<i>=<n>", the hold's member in K..":h"
--
-- Reply: {now, allowed, wait_1 .. wait_N, tat_1 .. tat_N, wrote_1 ..
-- wrote_N, mark_1 .. mark_N}
--   allowed  1 if every item had room (and so is held), else 0
--   wait_i   in [0, 2·tau_i]: max(TAT, now') − now' for item i (TAT after
--            the earlier items of the call on its key); the caller derives
--            the decision as for ratelimit_token_bucket.lua (a cost above
--            the burst, or wait + n·T > tau with n > 0, is denied)
--   tat_i    that TAT and mark_i its mark (1: marked); wrote_i the TAT
--            item i left (tat_i when it wrote nothing): what a Cluster
--            cancel restores (ratelimit_settle.lua)
--
-- Writes: the release of the expired holds of a marked key (kept whatever
-- the decision). When allowed: ZADD K..":h" now+ttl member for every item
-- (n = 0 included, so that its settle can charge); each key's TAT (TAT' =
-- now' + wait + n·T for n > 0), marked with its live holds and the latest
-- end, with a PX that outlives the TAT and its holds; PEXPIRE of K..":h"
-- to the same PX, so that it lives as long as K (a key's tombstones may
-- end early when a reservation of a shorter ttl follows one of a longer
-- ttl on a key that was not marked). A denial writes nothing else.
holdslib()
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end
local exp = now + tonumber(ARGV[2])

local N = #KEYS / 2
-- per key, {TAT, mark, live holds, last end, t of the last decision}
local S = {}
local reply = {now, 1}
local ok = true
for i = 1, N do
  local key, hkey = KEYS[2 * i - 1], KEYS[2 * i]
  local b = 3 + 4 * (i - 1)
  local T = tonumber(ARGV[b])
  local tau = tonumber(ARGV[b + 1])
  local n = tonumber(ARGV[b + 2])
  local k = S[key]
  if k == nil then
    local tat, marked, hn, last = hparse(redis.pcall('GET', key), key)
    if marked then
      local t0 = hnow(tat, now, tau, true)
      local reaped
      tat, hn, reaped = hreap(hkey, tat, t0, now, T, hn)
      if reaped then marked = hwrite(key, tat, t0, now, tau, hn, last) end
    end
    k = {tat, marked, hn, last, now}
    S[key] = k
  end
  local tat, marked = k[1], k[2]
  reply[2 + 3 * N + i] = marked and 1 or 0
  local t = hnow(tat, now, tau, marked)
  local wait = 0
  if tat > t then wait = tat - t end
  local nt = tat
  if n > 0 then
    if wait + n * T <= tau then
      nt = t + wait + n * T
    else
      ok = false
    end
  end
  if nt ~= tat then k[2] = k[3] > 0 or nt - t > tau end
  k[1], k[5] = nt, t
  reply[2 + i] = wait
  reply[2 + N + i] = tat
  reply[2 + 2 * N + i] = nt
end
if not ok then
  reply[2] = 0
  return reply
end

local exps = string.format('%d', exp)
for i = 1, N do
  local k = S[KEYS[2 * i - 1]]
  redis.call('ZADD', KEYS[2 * i], exps, ARGV[3 + 4 * (i - 1) + 3])
  k[3] = k[3] + 1
  if exp > k[4] then k[4] = exp end
end
for i = 1, N do
  local key = KEYS[2 * i - 1]
  local k = S[key]
  if k[6] == nil then
    k[6] = true
    -- marked: the key has live holds now (tau does not matter then);
    -- K..":h" gets K's TTL (hset)
    hwrite(key, k[1], k[5], now, 0, k[3], k[4])
  end
end
return reply
