-- ratelimit_holds.lua: the hold helpers of the bucket family (token bucket,
-- GCRA, leaky bucket), prepended by lua/ratelimit.go to every script that
-- reads a bucket: ratelimit_token_bucket.lua, ratelimit_buckets.lua,
-- ratelimit_batch.lua, ratelimit_refund.lua, ratelimit_hold.lua and
-- ratelimit_settle.lua. The arithmetic is ratelimit/hold.go line by line.
--
-- The layout of a bucket's key K, whose codec is hparse (decode) and
-- hvalue (encode) here, and ratelimit/hold_layout.go in Go (golden
-- vectors in lua/testdata/hold_layout.json, checked by both):
--   value := tat                         plain: not marked
--          | tat 'h' first ':' last hold*  marked (holds outstanding or a debt)
--   hold  := ',' id '/' i '=' est '@' end
-- all numbers decimal integers in µs (est in units). Decoded: tat, the mark,
-- and the holds h: h[FIRST] is at most the earliest end of a live hold (a
-- touch looks for expired holds only once now reaches it, then makes it
-- exact), h[LAST] the latest end, both 0 without holds (a debt alone:
-- "<tat>h0:0"; a reader ignores them when there is no hold); h[LIVE] the
-- holds' text ("" for none); h[FIRSTS] and h[LASTS] first's and last's
-- text as read (nil once the number changed: the encoder formats it).
--
-- A reserve and a settle each rewrite K alone: one SET, no second key. A settled hold
-- leaves nothing behind: a settle that finds no hold of its own says
-- "already settled" before the hold's end and "expired" after it (the end
-- travels with the settle). The plain decision scripts parse the holds
-- only when K is marked: a key without holds costs them nothing more than
-- before.
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

-- Named slots and constants. The fields of the holds h and of a call's
-- record k (hstate) are array slots with names, and hsettle's replies
-- named numbers: when it builds a script, lua/ratelimit.go writes each
-- NAME in brackets that a slots line below lists as its slot number (1,
-- 2, … in the order listed), and each NAME of the consts line as its
-- value. A table with named keys costs about 2.5k instructions more to
-- make (callgrind), and a local per name an upvalue per helper. The
-- consts are ratelimit/hold_redis.go's settleReply* (TestScriptConstants
-- checks that both sides name the same values).
--   slots h: FIRST LAST LIVE FIRSTS LASTS
--   slots k: TAT MARKED HOLDS CHANGED TNOW DIRTY TAU READ GTAT GMARKED GTNOW GROUP READMARKED RESTORE ADDED
--   consts: APPLIED=1 ALREADY_SETTLED=2 EXPIRED=3

-- holdslib() makes the helpers below and returns them; a script calls it
-- once, before it first needs them, as
--   if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite,
--     hstate, hadd, hflush, hsettle, hmget = holdslib() end
-- (a script that never meets a marked key makes no helper). The helpers are
-- holdslib's own locals, not upvalues of the script: a closure's upvalues
-- cost every call of every script that carries this file (13 of them took
-- about 1 µs a call, redis-benchmark EVALSHA of this prelude alone).
local hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget
local function holdslib()
local hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget
-- the library functions the helpers call, as upvalues (a global's field
-- costs two table reads per call)
local sfind, ssub, sfmt, smatch, sbyte, rcall, rpcall = string.find, string.sub, string.format, string.match, string.byte, redis.call, redis.pcall

-- The decoder: TAT, mark and holds of a GET reply v of key. The holds are
-- nil for a key that is not marked, else the table of the layout above;
-- (0, false, nil) for no state or garbage. The header's strings are kept,
-- so that a write formats only what changed.
function hparse(v, key)
  if type(v) ~= 'string' then return 0, false, nil end
  if sfind(v, 'h', 1, true) == nil then
    local x = tonumber(v)
    if x == nil then return 0, false, nil end
    return tatof(key, x), false, nil
  end
  local a, fs, ls, q = smatch(v, '^(%d+)h(%d+):(%d+)()')
  if a == nil then return 0, false, nil end
  local live = ''
  if q <= #v then
    if sbyte(v, q) ~= 44 then return 0, false, nil end -- not ','
    live = ssub(v, q)
  end
  -- digits: '+ 0' converts once (tonumber converts twice)
  return a + 0, true, {fs + 0, ls + 0, live, fs, ls} -- FIRST .. LASTS
end

function hnow(tat, now, tau, marked) -- now after the clamp
  if now < 0 then now = 0 end
  local slack = tau
  if marked then slack = 2 * tau end
  if now < tat - slack then return tat - slack end
  return now
end

-- releases the holds of h that ended by now: each gives its estimate back
-- (TAT = max(TAT - e·T, t) while TAT > t). Looks only once now reaches
-- h's first end, and then makes it exact. Returns the TAT and whether h
-- changed (then K must be written: a hold released, or first moved).
function hreap(h, tat, t, now, T)
  if h == nil or h[LIVE] == '' or now < h[FIRST] then return tat, false end
  local keep, first = {}, 0
  for ent, e, x in string.gmatch(h[LIVE], '(,[^,]-=(%d+)@(%d+))') do
    x = tonumber(x)
    if x <= now then
      if tat > t then
        tat = tat - tonumber(e) * T
        if tat < t then tat = t end
      end
    else
      keep[#keep + 1] = ent
      if first == 0 or x < first then first = x end
    end
  end
  h[LIVE], h[FIRST], h[FIRSTS] = table.concat(keep), first, nil
  if first == 0 then h[LAST], h[LASTS] = 0, '0' end
  return tat, true
end

-- The encoder: the value of a bucket key of TAT tat and holds h (hparse's
-- table, or nil), marked iff it has live holds or, without mark, tat - t >
-- tau (with mark: mark, a mark restored as it was read); hparse of it gives
-- back tat, the mark and the holds. Returns it, its TTL in ms (outliving
-- the TAT and every live hold) as a string ('%d': a number argument would
-- be formatted with '%.17g', which costs more; nil with keep, for a write
-- that keeps the key's TTL) and the mark.
function hvalue(tat, t, now, tau, h, keep, mark)
  local live = h ~= nil and h[LIVE] ~= ''
  local marked = live or tat - t > tau
  if mark ~= nil and not live then marked = mark end
  local ttl = tat - now
  local v
  if live then
    local fs, ls = h[FIRSTS], h[LASTS]
    if fs == nil then fs = sfmt('%d', h[FIRST]) end
    if ls == nil then ls = sfmt('%d', h[LAST]) end
    v = sfmt('%d', tat) .. 'h' .. fs .. ':' .. ls .. h[LIVE]
    if h[LAST] - now > ttl then ttl = h[LAST] - now end
  elseif marked then
    v = sfmt('%dh0:0', tat)
  else
    v = sfmt('%d', tat)
  end
  if keep then return v, nil, marked end
  local px = math.floor((ttl + 999) / 1000)
  if px < 1 then px = 1 end
  return v, sfmt('%d', px), marked
end

function hset(key, v, px) -- px: a TTL in ms, or nil to keep the key's
  if px == nil then
    rcall('SET', key, v, 'KEEPTTL')
  else
    rcall('SET', key, v, 'PX', px)
  end
end

-- hset of hvalue; returns the mark
function hwrite(key, tat, t, now, tau, h)
  local v, px, marked = hvalue(tat, t, now, tau, h)
  hset(key, v, px)
  return marked
end

-- The state of a key for the whole of one call of the hold or settle
-- script, read once and written once (hflush): with many holds on one
-- key, a call that settles and reserves several of them parses and
-- writes the key's value once, not once per hold. A record k:
--   k[TAT], k[MARKED]  the TAT and the mark; k[HOLDS]  hparse's table, or nil
--   k[CHANGED]  hold bookkeeping changed (a hold released, added or settled)
--   k[TNOW]  t of the last decision; k[TAU]; k[DIRTY]  to be written
--   k[READ]  the TAT as read (after the release of what ended)
--   k[GTAT], k[GMARKED], k[GTNOW]  TAT, mark and t before the group k[GROUP]
--     (ratelimit_hold.lua), which a denial of that group restores
--   k[READMARKED]  read marked (its TTL outlives its TAT and holds)
--   k[RESTORE]  the mark a cancel restores (nil: none); k[ADDED]  holds added
-- hstate returns key's record in S, making it from v (its value as read,
-- false for none) at the first touch: the release of the holds that
-- ended (not with noreap: a cancel's, see hsettle).
function hstate(S, key, v, T, tau, now, noreap)
  local k = S[key]
  if k ~= nil then return k end
  local tat, marked, h = 0, false, nil
  if v then
    -- a plain TAT has at most 17 characters, a marked one with Redis's
    -- clock at least 20: a marked value is not parsed as a number first
    tat = #v < 20 and tonumber(v)
    if tat then
      tat = tatof(key, tat)
    else
      tat, marked, h = hparse(v, key)
    end
  end
  local changed = false
  if marked and not noreap then
    local t0 = hnow(tat, now, tau, true)
    tat, changed = hreap(h, tat, t0, now, T)
    if changed then marked = h[LIVE] ~= '' or tat - t0 > tau end
  end
  -- in slot order: TAT, MARKED, HOLDS, CHANGED, TNOW, DIRTY, TAU, READ, GTAT,
  -- GMARKED, GTNOW, GROUP, READMARKED, RESTORE, ADDED
  k = {tat, marked, h, changed, now, changed, tau, tat, tat, marked, now, 0, h ~= nil, nil, false}
  S[key] = k
  return k
end

-- adds a live hold to k (written by hflush); exps is exp's string
function hadd(k, member, exp, exps)
  local h = k[HOLDS]
  if h == nil then
    h = {0, 0, '', '0', '0'} -- FIRST .. LASTS
    k[HOLDS] = h
  end
  if h[LIVE] == '' or exp < h[FIRST] then h[FIRST], h[FIRSTS] = exp, exps end
  if exp > h[LAST] then h[LAST], h[LASTS] = exp, exps end
  h[LIVE] = h[LIVE] .. ',' .. member .. '@' .. exps
  k[MARKED], k[CHANGED], k[DIRTY], k[ADDED] = true, true, true, true
end

-- writes a record that changed
function hflush(key, k, now)
  k[DIRTY] = false
  local h = k[HOLDS]
  if not k[CHANGED] and not k[READMARKED] then
    -- charged by fixed items alone, a key that had no mark: as the
    -- buckets script writes it (an allowed charge leaves TAT within tau
    -- of now': no debt, no mark); charged nothing (cost 0): left as read
    if k[TAT] ~= k[READ] then
      local px = math.floor((k[TAT] - now + 999) / 1000)
      if px < 1 then px = 1 end
      tatset(key, k[TAT], px)
    end
    return
  end
  if not k[CHANGED] and k[TAT] == k[READ] then return end -- nothing changed
  -- a key read marked whose TAT moved no later, with no hold added, keeps
  -- its TTL: it outlives the TAT and every hold
  local keep = k[READMARKED] and not k[ADDED] and k[TAT] <= k[READ]
  -- a cancel that restored a TAT writes the mark it saw (k[RESTORE])
  local v, px = hvalue(k[TAT], k[TNOW], now, k[TAU], h, keep, k[RESTORE])
  hset(key, v, px)
end

-- settles (or, with cancel, cancels) one item of the record k (hstate's;
-- a cancel's made with noreap), ARGV[b ..] its values as
-- ratelimit_settle.lua lists them (6 for a settle, 7 for a cancel), T and
-- tau the first two as numbers.
-- Returns APPLIED, ALREADY_SETTLED or EXPIRED; hflush writes k. The
-- contract is ratelimit_settle.lua's; ratelimit_hold.lua runs it for the
-- settles that ride on a reservation. A member "" is an item its
-- reservation charged without holding (a fixed item): only a cancel
-- touches it, giving its cost back as it would a hold's. A cancel does
-- not release what ended: the reserve it undoes did that (the memory
-- store decides a batch at one instant).
function hsettle(k, b, now, cancel, T, tau)
  local est = ARGV[b + 2] + 0 -- numbers from Go: '+ 0' converts once
  local actual, member = 0, ARGV[b + 3]
  if not cancel then actual, member = ARGV[b + 3] + 0, ARGV[b + 4] end
  local h = k[HOLDS]
  local found = cancel and member == ''
  if member ~= '' and h ~= nil and h[LIVE] ~= '' then
    local p = sfind(h[LIVE], ',' .. member .. '@', 1, true)
    if p ~= nil then
      local q = sfind(h[LIVE], ',', p + 1, true)
      local rest = ''
      if q ~= nil then rest = ssub(h[LIVE], q) end
      h[LIVE] = ssub(h[LIVE], 1, p - 1) .. rest
      if h[LIVE] == '' then h[FIRST], h[LAST], h[FIRSTS], h[LASTS] = 0, 0, '0', '0' end
      found = true
    end
  end
  if not found then
    if not cancel and now < ARGV[b + 5] + 0 then return ALREADY_SETTLED end
    return EXPIRED
  end
  local tat = k[TAT]
  local t = hnow(tat, now, tau, k[MARKED])
  local nt = tat
  if cancel and tat == ARGV[b + 5] + 0 then
    -- nothing charged since the reserve: restore what it saw, mark
    -- included, exactly as the memory store's rollback does
    nt = ARGV[b + 4] + 0
    k[RESTORE] = ARGV[b + 6] == '1'
  elseif actual < est then
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
  local live = h ~= nil and h[LIVE] ~= ''
  k[TAT], k[MARKED], k[CHANGED], k[TNOW], k[DIRTY], k[TAU] = nt, live or nt - t > tau, true, t, true, tau
  if k[RESTORE] ~= nil and not live then k[MARKED] = k[RESTORE] end
  return APPLIED
end
-- the values of keys (false for a missing key or one of another type), in
-- one MGET, or in chunks of 1000 that unpack fits on Lua's stack
function hmget(keys)
  local M = #keys
  if M <= 1000 then return rcall('MGET', unpack(keys)) end
  local cur = {}
  for j = 1, M, 1000 do
    local part = rcall('MGET', unpack(keys, j, math.min(j + 999, M)))
    for k = 1, #part do cur[j + k - 1] = part[k] end
  end
  return cur
end

return hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget
end
