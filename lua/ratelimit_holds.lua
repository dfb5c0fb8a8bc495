-- ratelimit_holds.lua: the hold helpers of the bucket family (token bucket,
-- GCRA, leaky bucket), prepended by lua/ratelimit.go to every script that
-- reads a bucket: ratelimit_token_bucket.lua, ratelimit_buckets.lua,
-- ratelimit_batch.lua, ratelimit_refund.lua, ratelimit_hold.lua and
-- ratelimit_settle.lua. The arithmetic is ratelimit/hold.go line by line.
--
-- A bucket's key K holds its TAT in µs, plain (see below) or, while the key is
-- marked (holds outstanding or a debt), "<tat>h<n>:<last>": n the number
-- of live holds, last the latest end (µs) of anything in K..":h". That
-- sorted set holds the key's holds (member "<hold id>/<i>=<estimate>",
-- score its release time) and the tombstones of settled holds (member
-- "<hold id>/<i>", score the release time the hold had: a settle retried
-- until then is recognised). The suffix is outside K's hash tag, so it
-- shares K's Cluster slot. The hold and settle scripts receive it in
-- KEYS; the plain decision scripts, which receive only K, derive it when,
-- and only when, K is marked: a key without holds costs them nothing more
-- than before.
--
-- The encoding of a plain TAT. When the scripts read Redis TIME (ARGV[1]
-- is ""), the hot paths (ratelimit_token_bucket.lua, ratelimit_buckets.lua,
-- ratelimit_batch.lua) write it compact: the key expires at E = ceil(TAT
-- / 1000), a Unix time in ms (SET … PXAT E, the very TTL "until the bucket
-- is full"), and holds r = E·1000 − TAT, an integer in [0, 999], which
-- Redis keeps as one of its shared integers (no value object per key). A
-- reader takes E from PEXPIRETIME: TAT = E·1000 − r, exactly (E·1000 <
-- 2^53 until the year 2248). Any other plain value is the TAT itself
-- (written by the rare paths — refunds, holds — and with a client clock,
-- whose time is not Redis's and so cannot name an expiry): in TIME mode a
-- TAT is a Unix time in µs, never below 1000. Redis before 7.0 has no
-- PEXPIRETIME (nor redis.REDIS_VERSION_NUM): there the TAT is kept itself.
local compact = ARGV[1] == '' and redis.REDIS_VERSION_NUM ~= nil

-- the TAT of a plain key, x its value as a number
local function tatof(key, x)
  if compact and x < 1000 then
    local e = redis.call('PEXPIRETIME', key)
    if e > 0 then return e * 1000 - x end
    return 0 -- no TTL: not ours, a full bucket
  end
  return x
end

-- writes a plain TAT; px is its TTL in ms from now (the client clock's
-- encoding). The compact write's two integers go as strings made with
-- '%d': Redis 7.0 formats a number argument with '%.17g', which costs more.
local function tatset(key, tat, px)
  if compact then
    local e = math.floor((tat + 999) / 1000)
    redis.call('SET', key, string.format('%d', e * 1000 - tat), 'PXAT', string.format('%d', e))
  else
    redis.call('SET', key, tat, 'PX', px)
  end
end

-- holdslib() defines the helpers below on its first call (a script that
-- never meets a marked key creates one closure, not five); call it before
-- using them.
local hparse, hnow, hreap, hvalue, hset, hwrite, hsettle
local function holdslib()
if hparse ~= nil then return end

-- TAT, mark, n, last of a GET reply of key (0, false: no state)
function hparse(v, key)
  if type(v) ~= 'string' then return 0, false, 0, 0 end
  local x = tonumber(v)
  if x ~= nil then return tatof(key, x), false, 0, 0 end
  local a, b, c = string.match(v, '^(%d+)h(%d+):(%d+)$')
  if a ~= nil then return tonumber(a), true, tonumber(b), tonumber(c) end
  return 0, false, 0, 0
end

function hnow(tat, now, tau, marked) -- now after the clamp
  if now < 0 then now = 0 end
  local slack = tau
  if marked then slack = 2 * tau end
  if now < tat - slack then return tat - slack end
  return now
end

-- removes what in hkey ended by now: each hold gives its estimate back
-- (TAT = max(TAT - e·T, t) while TAT > t), a tombstone nothing; returns
-- the TAT, the number of live holds left and whether a hold was released
function hreap(hkey, tat, t, now, T, n)
  local nows = string.format('%d', now)
  local gone = redis.call('ZRANGEBYSCORE', hkey, '-inf', nows)
  if #gone == 0 then return tat, n, false end
  local released = false
  for _, m in ipairs(gone) do
    local e = string.match(m, '=(%d+)$')
    if e ~= nil then
      released = true
      n = n - 1
      if tat > t then
        tat = tat - tonumber(e) * T
        if tat < t then tat = t end
      end
    end
  end
  redis.call('ZREMRANGEBYSCORE', hkey, '-inf', nows)
  if n < 0 then n = 0 end
  return tat, n, released
end

-- the value of a bucket key: marked iff n live holds > 0 or tat - t > tau;
-- returns it, its TTL in ms (outliving the TAT and, marked, everything in
-- K..":h") and the mark
function hvalue(tat, t, now, tau, n, last)
  local marked = n > 0 or tat - t > tau
  local ttl = tat - now
  local v
  if marked then
    v = string.format('%dh%d:%d', tat, n, last)
    if last - now > ttl then ttl = last - now end
  else
    v = string.format('%d', tat)
  end
  local px = math.floor((ttl + 999) / 1000)
  if px < 1 then px = 1 end
  return v, px, marked
end

-- writes v (hvalue's) to key with its TTL px; while n holds are live,
-- K..":h" gets the same TTL, so that it lives exactly as long as K: a
-- hold that expires unsettled is then still there for the next touch to
-- give back (a K..":h" that ended first would leave K counting it until K
-- itself ends). Without live holds K..":h" keeps the TTL it has, which
-- covers its tombstones.
function hset(key, v, px, n)
  redis.call('SET', key, v, 'PX', px)
  if n > 0 then redis.call('PEXPIRE', key .. ':h', px) end
end

function hwrite(key, tat, t, now, tau, n, last) -- hset of hvalue; returns the mark
  local v, px, marked = hvalue(tat, t, now, tau, n, last)
  hset(key, v, px, n)
  return marked
end

-- settles (or, with cancel, cancels) one item: key its bucket key, hkey
-- K..":h", ARGV[b .. b+9] its values as ratelimit_settle.lua lists them,
-- v key's value when the caller read it (nil: GET it).
-- Returns 1 applied, 2 already settled, 3 expired. The contract and the
-- writes are ratelimit_settle.lua's; ratelimit_hold.lua runs it for the
-- settles that ride on a reservation. A member "" is an item its
-- reservation charged without holding (a fixed item): only a cancel
-- touches it, giving its cost back as it would a hold's.
function hsettle(key, hkey, b, now, cancel, v)
  local T = tonumber(ARGV[b])
  local tau = tonumber(ARGV[b + 1])
  local est = tonumber(ARGV[b + 2])
  local actual = tonumber(ARGV[b + 3])
  local member, tomb = ARGV[b + 4], ARGV[b + 5]
  if v == nil then v = redis.pcall('GET', key) end -- v: the caller read it
  local tat, marked, hn, last = hparse(v, key)
  -- release what ended, as any touch of a marked key does; a settle also
  -- on a key that is not marked, which has no live holds but may have
  -- tombstones that ended. A cancel does not: the reserve it undoes did
  -- that (the memory store decides a batch at one instant)
  if not cancel then
    local t0 = hnow(tat, now, tau, marked)
    local reaped
    tat, hn, reaped = hreap(hkey, tat, t0, now, T, hn)
    if reaped then marked = hwrite(key, tat, t0, now, tau, hn, last) end
  end
  -- A settle adds the tombstone first: already there, the hold was
  -- settled (its retry); else removing the hold says whether it was live
  -- (when not, the tombstone goes again). The set never empties in
  -- between, so it keeps its TTL, which covers the tombstone (the hold's
  -- own end). A cancel leaves no tombstone.
  local fixed = member == ''
  local fresh = cancel or redis.call('ZADD', hkey, ARGV[b + 6], tomb) == 1
  if fresh and (fixed or redis.call('ZREM', hkey, member) == 1) then
    if not fixed then
      hn = hn - 1
      if hn < 0 then hn = 0 end
    end
    local t = hnow(tat, now, tau, marked)
    if cancel and tat == tonumber(ARGV[b + 8]) then
      -- nothing charged since the reserve: restore what it saw, mark
      -- included, exactly as the memory store's rollback does
      local v, px = hvalue(tonumber(ARGV[b + 7]), t, now, tau, hn, last)
      if hn == 0 then
        v = ARGV[b + 7]
        if ARGV[b + 9] == '1' then v = v .. string.format('h0:%d', last) end
      end
      hset(key, v, px, hn)
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
      hwrite(key, nt, t, now, tau, hn, last)
    end
    return 1
  elseif not fresh then
    return 2
  end
  if not cancel then redis.call('ZREM', hkey, tomb) end
  return 3
end
end

