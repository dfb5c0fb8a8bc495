-- ratelimit_holds.lua: the hold helpers of the bucket family (token bucket,
-- GCRA, leaky bucket), prepended by lua/ratelimit.go to every script that
-- reads a bucket: ratelimit_token_bucket.lua, ratelimit_buckets.lua,
-- ratelimit_batch.lua, ratelimit_refund.lua, ratelimit_hold.lua and
-- ratelimit_settle.lua. The arithmetic is ratelimit/hold.go line by line.
--
-- A bucket's key K holds its TAT in µs, "<tat>" or, while the key is
-- marked (holds outstanding or a debt), "<tat>h". A marked key's holds
-- live in the sorted set K..":h" (score: release time in µs; member:
-- "<hold id>/<item>=<estimate>"), its settled holds' tombstones in K..":s"
-- (score: end of the tombstone; member "<hold id>/<item>"). Both suffixes
-- are outside K's hash tag, so they share K's Cluster slot. The hold and
-- settle scripts receive them in KEYS; the plain decision scripts, which
-- receive only K, derive K..":h" when, and only when, K is marked: a key
-- without holds costs them nothing more than before.
--
-- These functions only define; they run nothing.
local function hparse(v) -- TAT and mark of a GET reply (0, false: no state)
  if type(v) ~= 'string' then return 0, false end
  local n = tonumber(v)
  if n ~= nil then return n, false end
  local m = string.match(v, '^(%d+)h$')
  if m ~= nil then return tonumber(m), true end
  return 0, false
end

local function hnow(tat, now, tau, marked) -- now after the clamp
  if now < 0 then now = 0 end
  local slack = tau
  if marked then slack = 2 * tau end
  if now < tat - slack then return tat - slack end
  return now
end

-- releases the holds of hkey whose release time is <= now: each gives its
-- estimate back (TAT = max(TAT - e·T, t) while TAT > t); returns the TAT
-- and whether any was released
local function hreap(hkey, tat, t, now, T)
  local nows = string.format('%d', now)
  local gone = redis.call('ZRANGEBYSCORE', hkey, '-inf', nows)
  if #gone == 0 then return tat, false end
  for _, m in ipairs(gone) do
    local e = tonumber(string.match(m, '=(%d+)$')) or 0
    if tat > t then
      tat = tat - e * T
      if tat < t then tat = t end
    end
  end
  redis.call('ZREMRANGEBYSCORE', hkey, '-inf', nows)
  return tat, true
end

local function hlast(hkey) -- the latest release time of a live hold, or nil
  local r = redis.call('ZRANGE', hkey, -1, -1, 'WITHSCORES')
  if r[2] == nil then return nil end
  return tonumber(r[2])
end

-- writes tat to key, marked iff holds are live (last ~= nil) or
-- tat - t > tau, with a TTL that outlives both the TAT and the holds;
-- returns the mark
local function hwrite(key, tat, t, now, tau, last)
  local marked = last ~= nil or tat - t > tau
  local ttl = tat - now
  if last ~= nil and last - now > ttl then ttl = last - now end
  local px = math.floor((ttl + 999) / 1000)
  if px < 1 then px = 1 end
  local v = string.format('%d', tat)
  if marked then v = v .. 'h' end
  redis.call('SET', key, v, 'PX', px)
  return marked
end

