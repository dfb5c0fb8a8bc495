-- ratelimit_buckets.lua: decide token-bucket / GCRA / leaky-bucket items
-- in one call, all or nothing per group: the lean path of
-- ratelimit.RedisStore for a batch (one Cluster slot group) whose items are
-- all of the bucket family, and for several callers' batches coalesced into
-- one call (each caller's batch is one group). Same arithmetic as
-- ratelimit_token_bucket.lua, ratelimit_batch.lua and
-- ratelimit/algorithms.go (bucketDecide), with a smaller ARGV and reply.
--
-- KEYS[i]  the state key of item i: the theoretical arrival time TAT in
--          integer µs (absent = full bucket), encoded as
--          ratelimit_holds.lua says. All keys of one call hash to one
--          Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  P, the number of distinct policies of the call; −P when the
--          reply must carry the TATs (a Cluster slot group, for a refund)
-- ARGV[3 .. 2+2P]  policy j's two values:
--          T    the emission interval ceil(Period/Limit) in µs (≥ 1)
--          tau  Burst·T in µs, the capacity in time (≤ 2^52)
-- then G, the number of groups, and the number of items of each group,
--          in KEYS order (they sum to N = #KEYS)
-- then, for item i, its policy's index j (1 .. P) when its cost is 1,
--          else −j and the cost n (≥ 0; 0 peeks; ≤ Burst+1 ≤ 2^52+1,
--          exact: Go sends a larger cost as Burst+1). A call of many
--          callers' requests sends each policy once and, per item of unit
--          cost, one small integer.
--
-- Reply: an array of 1 + N integers {now, wait_1 .. wait_N}, followed,
-- when P was sent negative, by N more {tat_1 .. tat_N}:
--   now     the µs time the call decided at (before the per-item clamp)
--   wait_i  in [0, tau_i] ([0, 2·tau_i] on a key marked by holds or a
--           debt): max(TAT, now') − now' for item i, where TAT
--           includes the charges that earlier items on the same key made:
--           the earlier items of its group that had room, and every item
--           of an earlier group that was allowed. The caller derives each
--           decision from it exactly as for ratelimit_token_bucket.lua
--           (need = wait + n·T; the item has room iff n·T ≤ tau and need ≤
--           tau), and a group is allowed iff every item of it has room.
--   tat_i   that TAT itself (0: no state): what a Cluster refund restores
--           (ratelimit_refund.lua); with now, the caller recomputes the TAT'
--           the item wrote. When that state was marked by holds or a
--           debt, tat_i is −TAT − 1 instead (a refund restores the mark
--           with it); otherwise it is ≥ 0.
--
-- Groups are decided in order, each exactly as if it were a call of its
-- own made after the previous ones: a denied group charges nothing and
-- changes nothing a later group sees.
--
-- Writes: for each item with n > 0 of an allowed group: TAT' = now' +
-- need until it, as ratelimit_token_bucket.lua writes it, in call order;
-- a key charged several times is written once, with its last charge,
-- which includes the earlier ones.
-- A denied group writes nothing but the release of the expired holds of
-- a marked key ("<tat>h…", see ratelimit_holds.lua), which is kept; a
-- marked key's clamp is TAT − 2·tau, and its charges keep the mark while
-- holds are live. now' is now clamped, per item, to
-- TAT − tau, the earliest time the state proves was seen (time going
-- backwards). A key of another type or content reads as a full bucket and
-- is overwritten. Redis formats a number argument with up to 17
-- significant digits, so the 16-digit µs TAT' goes through exactly.
--
-- Cost: per distinct key, one share of the MGET, one SET (however many
-- items charge it), and one PEXPIRETIME only
-- for a compact key that exists; an absent key (the common case of a
-- key whose bucket refilled, hence expired) is read as a full bucket
-- without further work, and the per-item bookkeeping lives in arrays
-- indexed by item rather than in hashes keyed by the key (the one hash,
-- pending, is what lets a repeated key see its earlier charges).
local rcall, floor = redis.call, math.floor
local now = tonumber(ARGV[1])
if now == nil then
  local t = rcall('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end

local N = #KEYS
local P = tonumber(ARGV[2])
local tats = P < 0 -- reply the TATs too
if tats then P = -P end
local PT, Ptau = {}, {}
for j = 1, P do PT[j], Ptau[j] = tonumber(ARGV[1 + 2 * j]), tonumber(ARGV[2 + 2 * j]) end
local a = 3 + 2 * P -- the ARGV cursor
local G = tonumber(ARGV[a])
local sizes = {}
for g = 1, G do sizes[g] = tonumber(ARGV[a + g]) end
a = a + G + 1

-- MGET reads the keys (false for a missing key or one of another type),
-- in chunks that unpack fits on Lua's stack
local cur
if N <= 1000 then
  cur = rcall('MGET', unpack(KEYS))
else
  cur = {}
  for j = 1, N, 1000 do
    local part = rcall('MGET', unpack(KEYS, j, math.min(j + 999, N)))
    for k = 1, #part do cur[j + k - 1] = part[k] end
  end
end
-- pending: key -> TAT charged by an earlier item of this call (of its
-- group, or of an allowed earlier group). Per item i that is charged:
-- nv[i] the value it writes, prev[i] pending's value for its key before
-- the charge (nil: none), and npx[i] the PX TTL in ms when the value is
-- not written compact. A denied group is undone by walking its items
-- back: pending restored from prev, nv cleared (nothing written).
local pending = {}
local nv, prev, npx = {}, {}, nil
-- Only for keys whose value is not a plain TAT (marked by holds or a
-- debt: ratelimit_holds.lua), created on the first: st, sm each key's TAT
-- and mark as the call found them, after releasing expired holds (kept
-- whatever the decisions); hl a marked key's {live holds, last end};
-- pmark the mark of a pending TAT, um (per item) its undo
local st, sm, hl, pmark, um
-- rep: some key was charged by two items of the call (a hot key shared
-- by several callers' requests)
local rep = false
local reply = {now}
local i = 0
for g = 1, G do
  local size = sizes[g]
  local ok = true
  local i0 = i
  for _ = 1, size do
    i = i + 1
    local key = KEYS[i]
    local j, n = tonumber(ARGV[a]), 1
    a = a + 1
    if j < 0 then
      j, n = -j, tonumber(ARGV[a])
      a = a + 1
    end
    local T, tau = PT[j], Ptau[j]
    local tat, marked = pending[key], pmark and pmark[key]
    if tat == nil then
      local c = cur[i]
      marked = false
      if c == false then
        tat = 0 -- no state: a full bucket
      else
        tat = tonumber(c)
        if tat ~= nil then
          tat = tatof(key, tat)
        else
          -- not a plain TAT: a marked key or garbage (parsed and
          -- released once per call, then cached)
          if st == nil then
            if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
            st, sm, hl = {}, {}, {}
          end
          tat, marked = st[key], sm[key]
          if tat == nil then
            local h
            tat, marked, h = hparse(c, key)
            if marked then
              local t0 = hnow(tat, now, tau, true)
              local changed
              tat, changed = hreap(h, tat, t0, now, T)
              hl[key] = h
              if changed then marked = hwrite(key, tat, t0, now, tau, h) end
            end
            st[key], sm[key] = tat, marked
          end
        end
      end
    end
    local t = now
    local slack = tau
    if marked then slack = 2 * tau end
    if t < tat - slack then t = tat - slack end
    local wait = 0
    if tat > t then wait = tat - t end
    local need = wait + n * T
    if n > 0 and need <= tau then
      local v = t + need
      prev[i] = pending[key]
      if prev[i] ~= nil then rep = true end
      if pmark then um[i] = pmark[key] end
      pending[key] = v
      local h = hl and hl[key]
      if h then
        -- a marked key stays marked while holds are live (hvalue)
        if pmark == nil then pmark, um = {}, {} end
        if npx == nil then npx = {} end
        pmark[key] = h[LIVE] ~= ''
        v, npx[i] = hvalue(v, t, now, tau, h) -- px in ms
      elseif not compact then
        if npx == nil then npx = {} end
        npx[i] = floor((need + 999) / 1000)
      end
      nv[i] = v
    elseif n > 0 then
      ok = false
    end
    reply[1 + i] = wait
    if tats then
      if marked then reply[1 + N + i] = -tat - 1 else reply[1 + N + i] = tat end
    end
  end
  if not ok then
    for k = i, i0 + 1, -1 do
      if nv[k] ~= nil then
        pending[KEYS[k]] = prev[k]
        if pmark then pmark[KEYS[k]] = um[k] end
        nv[k] = nil
      end
    end
  end
end

-- the writes, in call order, each charged key once: with its last
-- charge, which includes the earlier ones (last: key -> that item, made
-- only when a key was charged twice). A compact write is tatset's
-- (ratelimit_holds.lua), inline, with the expiry's string kept: the keys
-- of one call mostly share their expiry.
local fmt, elast, estr = string.format, nil, nil
local last
if rep then
  last = {}
  for k = 1, N do
    if nv[k] ~= nil then last[KEYS[k]] = k end
  end
end
for k = 1, N do
  local v = nv[k]
  if v ~= nil and (last == nil or last[KEYS[k]] == k) then
    if compact and type(v) == 'number' then
      local e = floor((v + 999) / 1000) -- tatset, inline
      if e ~= elast then elast, estr = e, fmt('%d', e) end
      rcall('SET', KEYS[k], fmt('%d', e * 1000 - v), 'PXAT', estr)
    else
      local h = hl and hl[KEYS[k]]
      if h then
        hset(KEYS[k], v, npx[k]) -- marked (hvalue)
      else
        rcall('SET', KEYS[k], v, 'PX', npx[k]) -- a client clock's TAT
      end
    end
  end
end
return reply
