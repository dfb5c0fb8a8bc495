-- ratelimit_token_bucket.lua: one token-bucket / GCRA / leaky-bucket
-- decision, the lean common path of ratelimit.RedisStore (a single item of
-- the bucket family). Same arithmetic as ratelimit_batch.lua and
-- ratelimit/algorithms.go (bucketDecide).
--
-- KEYS[1]  the state key: the theoretical arrival time TAT in integer µs
--          (absent = full bucket), encoded as ratelimit_holds.lua says
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  T, the emission interval ceil(Period/Limit) in µs (≥ 1)
-- ARGV[3]  tau = Burst·T in µs, the capacity in time (≤ 2^52)
-- ARGV[4]  n, the cost (≥ 0; 0 peeks; ≤ Burst+1 ≤ 2^52+1, exact: Go sends a larger cost as Burst+1)
--
-- Reply: wait, an integer in [0, tau] (in [0, 2·tau] for a key marked by
-- holds or a debt: see ratelimit_holds.lua): max(TAT, now') − now', how far
-- the bucket is from full before this call (now' is now clamped, see below).
-- The caller derives the decision from it (need = wait + n·T): allowed iff
-- n = 0, or n·T ≤ tau and need ≤ tau; then remaining = floor((tau − need)/T)
-- and reset = need; when denied, remaining = floor((tau − wait)/T), reset =
-- wait and retry = need − tau (0 when n·T > tau: it never fits).
--
-- Writes: only when allowed with n > 0: TAT' = now' + need, until it (with
-- Redis TIME: SET KEYS[1] r PXAT ceil(TAT'/1000), the compact encoding of
-- ratelimit_holds.lua; with the client's clock: SET KEYS[1] TAT' PX
-- ceil(need/1000), ≥ 1 ms; at its end the bucket is full, and no key
-- means the same). A denial writes nothing. A marked key ("<tat>h…") takes
-- the holds path: its expired holds are released first (written whatever
-- the decision), the clamp is TAT − 2·tau, and a charge keeps the mark
-- while holds are live (ratelimit_holds.lua). Time going backwards is clamped
-- to TAT − tau, the earliest time the state proves was seen. Redis formats
-- a number argument with up to 17 significant digits, so the 16-digit µs
-- TAT' goes through exactly (string.format would cost more).
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end
local T = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local v = redis.pcall('GET', KEYS[1])
local tat = tonumber(v)
if tat ~= nil then
  tat = tatof(KEYS[1], tat)
else
  if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
  local marked, h
  tat, marked, h = hparse(v, KEYS[1])
  if marked then
    -- a key with holds or a debt (ratelimit_holds.lua): release the
    -- expired holds, then decide with the clamp TAT - 2·tau
    local key = KEYS[1]
    local t = hnow(tat, now, tau, true)
    local changed
    tat, changed = hreap(h, tat, t, now, T)
    if changed then marked = hwrite(key, tat, t, now, tau, h) end
    t = hnow(tat, now, tau, marked)
    local wait = 0
    if tat > t then wait = tat - t end
    if n > 0 and wait + n * T <= tau then hwrite(key, t + wait + n * T, t, now, tau, h) end
    return wait
  end
end
if now < tat - tau then now = tat - tau end
local wait = 0
if tat > now then wait = tat - now end
local need = wait + n * T
if n > 0 and need <= tau then
  tatset(KEYS[1], now + need, math.floor((need + 999) / 1000))
end
return wait
