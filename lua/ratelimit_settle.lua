-- ratelimit_settle.lua: settle, the second half of reserve-then-settle
-- (ratelimit.Hold.Settle on a RedisStore): replace each item's hold by its
-- actual cost, at most once per hold. Also the cancel of a Cluster
-- reserve whose other slot group was denied. The arithmetic is
-- ratelimit/hold.go (heldSettle) line by line; the helpers and the layout
-- of holds are ratelimit_holds.lua.
--
-- KEYS[i]  item i's bucket key K ("<tat>", or "<tat>h<first>:<last>" and
--          its live holds). All keys hash to one Cluster slot; a key may
--          repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  0 to settle; 1 to cancel: undo a reserve, restoring the TAT
--          and mark exactly when the key still holds what the reserve
--          wrote
-- then, for item i, 6 values to settle:
--          T, tau  the emission interval and Burst·T in µs (tau ≤ 2^51)
--          est     the estimate held
--          actual  the actual cost (≤ est + 2·Burst: Go caps it, beyond
--                  which the debt is at its bound anyway)
--          member  "<hold id>/<i>=<est>", the hold
--          exp     the hold's release time (µs)
--        or 7 to cancel:
--          T, tau, est  as above
--          member  as above, or "" for an item its reservation charged
--                  without holding it (a fixed item: its cost given back
--                  as a hold's estimate would be)
--          old, wrote, mark  the TAT the reserve saw and wrote, and the
--                  mark it saw (1: marked)
--
-- Reply: one integer per item, ratelimit_holds.lua's named values:
-- APPLIED (1); ALREADY_SETTLED (2): no hold of that name and its release
-- time still to come (a second settle, the retry of one whose reply was
-- lost, or a key reset meanwhile); EXPIRED (3): no hold and its release
-- time passed (it was given back), or a cancel that found nothing to
-- undo.
--
-- Writes: one MGET, then per item in order (in reverse order for a
-- cancel, so that two items on one key each find what the other left),
-- on the key's state kept for the call: at its first touch, the release
-- of the holds that ended (as every script touching a marked key does; a
-- cancel never); then, if the hold is live, its removal and TAT' from δ =
-- actual − est (t = now after the clamp): δ < 0 gives |δ|·T back, TAT' =
-- max(TAT − |δ|·T, t) while TAT > t; δ > 0 charges TAT' = min(max(TAT, t)
-- + δ·T, t + 2·tau), at most one burst of debt. Each key that changed is
-- written once at the end, with its mark (live holds or TAT' − t > tau)
-- and a PX that outlives both (a TAT no later than read, no hold added:
-- the TTL it had). A settle that finds no hold writes only the release of
-- what ended.
if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end
local cancel = ARGV[2] == '1'

local N = #KEYS
local F = 6 -- values per item
if cancel then F = 7 end
-- one MGET, then each key's record (hstate) read once and written once
local cur = hmget(KEYS)
local S = {}
local reply = {}
for i = 1, N do reply[i] = 0 end
local from, to, step = 1, N, 1
if cancel then from, to, step = N, 1, -1 end -- a cancel undoes last first
for i = from, to, step do
  local b = 3 + F * (i - 1)
  local T, tau = ARGV[b] + 0, ARGV[b + 1] + 0
  local k = hstate(S, KEYS[i], cur[i], T, tau, now, cancel)
  reply[i] = hsettle(k, b, now, cancel, T, tau)
end
for i = 1, N do
  local k = S[KEYS[i]]
  if k[DIRTY] then hflush(KEYS[i], k, now) end
end
return reply
