-- ratelimit_fixed.lua: decide N fixed-window items all or nothing per
-- group in one call: the lean path of ratelimit_batch.lua for batches
-- whose items are all fixed windows (fixed_window), with the same state, the
-- same decisions and the same writes, but one MGET for every key, a small
-- ARGV and one reply value per item.
--
-- KEYS[i]  the state key of item i (all in one Cluster slot).
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  Q, the number of distinct policies
-- then Q pairs: L (limit), P (period in µs)
-- then G, the number of groups, and the number of items of each group,
--          in KEYS order (they sum to N = #KEYS)
-- then, for item i: its policy's index j (1-based) when its cost is 1,
--          else −j and the cost n (≥ 0; 0 peeks; ≤ L+1)
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
-- order, SET "k:c" PX ceil(reset/1000) ms ≥ 1; a denied group changes no
-- state.
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
local Ls, Ps = {}, {}
for j = 1, Q do
  Ls[j] = tonumber(ARGV[1 + 2 * j])
  Ps[j] = tonumber(ARGV[2 + 2 * j])
end
local a = 3 + 2 * Q
local G = tonumber(ARGV[a])
local ci = a + G + 1 -- ARGV index of the next item's code

local vals = redis.call('MGET', unpack(KEYS))
local state = {} -- key -> {w, c} written by allowed earlier groups
local reply = {now}
local writes = {}
local i = 0
for g = 1, G do
  local gs, gw = {}, {} -- the group's own state and writes
  local all = true
  for _ = 1, tonumber(ARGV[a + g]) do
    i = i + 1
    local j = tonumber(ARGV[ci])
    local n = 1
    if j < 0 then
      j, n = -j, tonumber(ARGV[ci + 1])
      ci = ci + 2
    else
      ci = ci + 1
    end
    local L, P = Ls[j], Ps[j]
    local key = KEYS[i]
    local w, c = 0, 0
    local st = gs[key] or state[key]
    if st ~= nil then
      w, c = st[1], st[2]
    else
      local s = vals[i]
      if s then
        local ws, cs = match(s, '^(%d+):(%d+)$')
        if ws ~= nil then w, c = tonumber(ws), tonumber(cs) end
      end
    end
    local t, behind = now, false
    if t < w * P then t, behind = w * P, true end -- time went backwards: stay in the window
    local k = floor(t / P)
    if k ~= w then c = 0 end
    if behind then reply[i + 1] = -(c + 1) else reply[i + 1] = c end
    if n > L or c + n > L then
      all = false
    elseif n > 0 then
      c = c + n
      gs[key] = {k, c}
      local px = floor(((k + 1) * P - t + 999) / 1000)
      if px < 1 then px = 1 end
      gw[#gw + 1] = {key, fmt('%d:%d', k, c), px} -- %d: %.14g would round
    end
  end
  if all then
    for key, st in pairs(gs) do state[key] = st end
    for _, x in ipairs(gw) do writes[#writes + 1] = x end
  end
end

for _, x in ipairs(writes) do
  redis.call('SET', x[1], x[2], 'PX', x[3])
end
return reply
