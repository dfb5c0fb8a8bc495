-- ratelimit_settle.lua: settle, the second half of reserve-then-settle
-- (ratelimit.Hold.Settle on a RedisStore): replace each item's hold by its
-- actual cost, at most once per hold. Also the cancel of a Cluster
-- reserve whose other slot group was denied. The arithmetic is
-- ratelimit/hold.go (heldSettle) line by line; the helpers and the layout
-- of holds are ratelimit_holds.lua.
--
-- KEYS[3i-2]  item i's bucket key K ("<tat>" or "<tat>h")
-- KEYS[3i-1]  K..":h", its holds (sorted set, score = release time)
-- KEYS[3i]    K..":s", its tombstones (sorted set: member "<hold id>/<i>",
--             score = the end of the tombstone)
--             All keys hash to one Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  life of a tombstone in µs (the hold's ttl), or 0 to cancel:
--          undo a reserve without leaving tombstones, restoring the TAT
--          exactly when the key still holds what the reserve wrote
-- then, for item i, 9 values:
--          T, tau  the emission interval and Burst·T in µs (tau ≤ 2^51)
--          est     the estimate held; actual the actual cost (≤ est +
--                  2·Burst: Go caps it, beyond which the debt is at its
--                  bound anyway; 0 when cancelling)
--          member  "<hold id>/<i>=<est>", the hold in K..":h"
--          tomb    "<hold id>/<i>", its tombstone in K..":s"
--          old, wrote, mark  cancel only: the TAT the reserve saw and
--                  wrote, and the mark it saw (1: marked)
--
-- Reply: one integer per item: 1 applied, 2 already settled (a tombstone
-- is there: a second settle, or the retry of one whose reply was lost), 3
-- expired (the hold was released, or its key reset).
--
-- Writes, per item in order (in reverse order for a cancel, so that two
-- items on one key each find what the other left): the release of the key's expired holds (as
-- every script touching a marked key does) and of its ended tombstones;
-- then, if the hold is live: ZREM of it; TAT' from δ = actual − est
-- (t = now after the clamp): δ < 0 gives |δ|·T back, TAT' = max(TAT −
-- |δ|·T, t) while TAT > t; δ > 0 charges TAT' = min(max(TAT, t) + δ·T, t +
-- 2·tau), at most one burst of debt; written with the mark (live holds or
-- TAT' − t > tau) and a PX that outlives both; ZADD of the tombstone and
-- PEXPIRE of K..":s" to its latest end. An already settled or expired
-- hold changes nothing else.
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end
local life = tonumber(ARGV[2])
local nows = string.format('%d', now)

local N = #KEYS / 3
local reply = {}
local from, to, step = 1, N, 1
if life == 0 then from, to, step = N, 1, -1 end -- a cancel undoes last first
for i = from, to, step do
  local key, hkey, skey = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local b = 3 + 9 * (i - 1)
  local T = tonumber(ARGV[b])
  local tau = tonumber(ARGV[b + 1])
  local est = tonumber(ARGV[b + 2])
  local actual = tonumber(ARGV[b + 3])
  local member, tomb = ARGV[b + 4], ARGV[b + 5]
  local tat, marked = hparse(redis.pcall('GET', key))
  if marked then
    local t0 = hnow(tat, now, tau, true)
    local reaped
    tat, reaped = hreap(hkey, tat, t0, now, T)
    if reaped then marked = hwrite(key, tat, t0, now, tau, hlast(hkey)) end
  end
  if life > 0 then redis.call('ZREMRANGEBYSCORE', skey, '-inf', nows) end
  if redis.call('ZREM', hkey, member) == 1 then
    local t = hnow(tat, now, tau, marked)
    if life == 0 and tat == tonumber(ARGV[b + 7]) then
      -- cancel, nothing charged since the reserve: restore what it saw,
      -- mark included, exactly as the memory store's rollback does
      local last = hlast(hkey)
      local ttl = tonumber(ARGV[b + 6])
      if last ~= nil and last > ttl then ttl = last end
      local px = math.floor((ttl - now + 999) / 1000)
      if px < 1 then px = 1 end
      local v = ARGV[b + 6]
      if ARGV[b + 8] == '1' then v = v .. 'h' end
      redis.call('SET', key, v, 'PX', px)
    else
      local nt = tat
      if actual < est then
        if tat > t then
          nt = tat - (est - actual) * T
          if nt < t then nt = t end
        end
      elseif actual > est then
        local base = tat
        if base < t then base = t end
        nt = base + (actual - est) * T
        if nt > t + 2 * tau then nt = t + 2 * tau end
      end
      hwrite(key, nt, t, now, tau, hlast(hkey))
    end
    if life > 0 then
      redis.call('ZADD', skey, string.format('%d', now + life), tomb)
      local r = redis.call('ZRANGE', skey, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', skey, math.floor((tonumber(r[2]) - now + 999) / 1000))
    end
    reply[i] = 1
  elseif life > 0 and redis.call('ZSCORE', skey, tomb) then
    reply[i] = 2
  else
    reply[i] = 3
  end
end
return reply
