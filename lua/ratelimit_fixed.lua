-- ratelimit_fixed.lua: decide N fixed-window items all or nothing per
-- group in one call: the lean path of ratelimit_batch.lua for batches
-- whose items are all fixed windows (fixed_window), with the same state and
-- the same decisions, but one MGET for every key, a small ARGV, one reply
-- value per item, and the least work per key: each policy's window,
-- window prefix and TTL computed once per call, no table per item, and a
-- key that already holds the current window rewritten with KEEPTTL (its
-- TTL, set by the window's first charge, stands) when the time is Redis's.
--
-- KEYS[i]  the state key of item i (all in one Cluster slot).
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  Q, the number of distinct policies
-- then Q pairs: L (limit), P (period in µs)
-- then G, the number of groups, and the number of items of each group,
--          in KEYS order (their absolute values sum to N = #KEYS); a
--          group's size −m says it has m items whose codes are the
--          previous group's again (they are not sent a second time)
-- then, for item i (of each group whose size is not negative): its
--          policy's index j (1-based) when its cost is 1, else −j and the
--          cost n (≥ 0; 0 peeks; ≤ L+1)
--
-- Reply: {now, then one integer per item}: c, the count the item saw in
--   its window before its own charge (including the charges of earlier
--   items of its group, and of allowed earlier groups, on its key), or
--   −(c+1) when the clock was behind the stored window (the item was
--   then decided at the start of that window, as ratelimit_batch.lua
--   does). The decision follows: ok iff n ≤ L and c + n ≤ L.
--
-- State, one key per item: the string "w:count" (w = window index), as
-- ratelimit_batch.lua reads and writes it; a value of another form reads
-- as empty. Writes: each item with n > 0 of every allowed group, in
-- order, SET "k:c" PX ceil(reset/1000) ms ≥ 1, or KEEPTTL when ARGV[1]
-- is "" and the key already holds window k (a value read, not behind);
-- a denied group changes no state.

local floor = math.floor
local match = string.match
local fmt = string.format
local tonumber = tonumber

local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
if now < 0 then now = 0 end

local Q = tonumber(ARGV[2])
local Ls, Ps, Ks, Xs, Ws = {}, {}, {}, {}, {}
for j = 1, Q do
  local P = tonumber(ARGV[2 + 2 * j])
  Ls[j], Ps[j] = tonumber(ARGV[1 + 2 * j]), P
  local k = floor(now / P)
  Ks[j], Ws[j] = k, fmt('%d:', k)
  local px = floor(((k + 1) * P - now + 999) / 1000)
  if px < 1 then px = 1 end
  Xs[j] = fmt('%d', px) -- a string: SET's argument, not converted per write
end
local a = 3 + 2 * Q
local G = tonumber(ARGV[a])
local ci = a + G + 1
local keep = ARGV[1] == '' -- Redis's clock: a key of the current window keeps its TTL

local vals = redis.call('MGET', unpack(KEYS))
local sw, sc = {}, {} -- key -> window, count: the state of allowed earlier groups and of this one
local wk, wv, wx = {}, {}, {} -- writes: key, value, px
local nw = 0
local reply = {now}
local i = 0
local cprev
local undo, nu = {}, 0 -- the current group's changes of sw/sc: key, old w, old c
local cstr = {} -- count -> its decimal string
for g = 1, G do
  local nw0 = nw
  nu = 0
  local all = true
  local m = tonumber(ARGV[a + g])
  local m0, cnext = m, ci
  if m < 0 then
    m, ci = -m, cprev -- the codes of the previous group again
  end
  local cfirst = ci
  for _ = 1, m do
    i = i + 1
    local j = tonumber(ARGV[ci])
    local n = 1
    if j < 0 then
      j, n = -j, tonumber(ARGV[ci + 1])
      ci = ci + 2
    else
      ci = ci + 1
    end
    local L, P, k = Ls[j], Ps[j], Ks[j]
    local key = KEYS[i]
    local w, c = sw[key], 0
    if w ~= nil then
      c = sc[key]
    else
      w = 0
      local s = vals[i]
      if s then
        local ws, cs = match(s, '^(%d+):(%d+)$')
        if ws ~= nil then w, c = tonumber(ws), tonumber(cs) end
      end
    end
    local px = Xs[j]
    if now < w * P then -- time went backwards: stay in the stored window
      k = w
      px = fmt('%d', floor((P + 999) / 1000))
      reply[i + 1] = -(c + 1)
    else
      if k ~= w then
        c = 0
      elseif keep and vals[i] then
        px = false -- the stored window's key: its TTL stands
      end
      reply[i + 1] = c
    end
    if n > L or c + n > L then
      all = false
    elseif n > 0 then
      undo[nu + 1], undo[nu + 2], undo[nu + 3] = key, sw[key] or false, sc[key] or false
      nu = nu + 3
      c = c + n
      sw[key], sc[key] = k, c
      local v
      if k == Ks[j] then
        local cs = cstr[c]
        if cs == nil then
          cs = fmt('%d', c)
          cstr[c] = cs
        end
        v = Ws[j] .. cs
      else
        v = fmt('%d:%d', k, c)
      end
      nw = nw + 1
      wk[nw], wv[nw], wx[nw] = key, v, px
    end
  end
  if m0 < 0 then ci = cnext end
  cprev = cfirst
  if not all then
    nw = nw0
    for u = nu - 2, 1, -3 do
      local key = undo[u]
      sw[key], sc[key] = undo[u + 1] or nil, undo[u + 2] or nil
    end
  end
end

for x = 1, nw do
  local px = wx[x]
  if px then
    redis.call('SET', wk[x], wv[x], 'PX', px)
  else
    redis.call('SET', wk[x], wv[x], 'KEEPTTL')
  end
end
return reply
