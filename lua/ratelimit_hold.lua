-- ratelimit_hold.lua: reserve, the first half of reserve-then-settle
-- (ratelimit.RedisStore.Reserve): decide groups of token-bucket / GCRA /
-- leaky-bucket items, each all or nothing, and, when every item of a
-- group has room, hold each item's estimate under its group's hold id
-- until ratelimit_settle.lua settles it or its TTL passes. The arithmetic is ratelimit/hold.go
-- (heldDecide) line by line; the helpers (hparse, hnow, hreap, hadd,
-- hwrite, hsettle) and the layout of holds are ratelimit_holds.lua.
--
-- KEYS[i]  item i's bucket key K: its TAT in µs, "<tat>" or, marked,
--          "<tat>h<first>:<last>" and its live holds (absent = full
--          bucket). All keys hash to one Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  G, the number of groups: several callers' reservations
--          coalesced into one call (ratelimit/redis_coalesce.go), each
--          decided all or nothing, in order, exactly as if it were a call
--          of its own made after the earlier ones; sent as −G, it asks
--          for the TATs and marks in the reply (what a Cluster cancel
--          needs)
-- ARGV[3 .. 2+2G]  group g's size (its items are the next ones in KEYS
--          order; the sizes sum to N) and ttl, the life of its holds in
--          µs (1000 .. 2^51)
-- then, for item i, 4 values:
--          T       the emission interval in µs (≥ 1)
--          tau     Burst·T in µs (≤ 2^51)
--          n       the estimate (≥ 0; ≤ Burst+1, Go sends a larger one as
--                  Burst+1: denied as exceeding)
--          member  "<hold id>/<i>=<n>", the hold's name in K's value;
--                  "" for a fixed item: decided and charged with its
--                  group as the buckets script charges, holding nothing
--                  (no member, no mark of its own)
-- then, for each settle that rides on the call (KEYS[N+1 ..], one per
--          item), the 6 values of a settled item of ratelimit_settle.lua;
--          the settles run first, in order, so that the reservations see
--          them
--
-- Reply: {now, allowed_1 .. allowed_G, wait_1 .. wait_N, settled_1 ..
-- settled_S}, or, asked with −G, {now, allowed_1 .. allowed_G, wait_1 ..
-- wait_N, tat_1 .. tat_N, wrote_1 .. wrote_N, mark_1 .. mark_N,
-- settled_1 .. settled_S}
--   allowed_g  1 if every item of group g had room (and so is held)
--   wait_i   in [0, 2·tau_i]: max(TAT, now') − now' for item i (TAT after
--            the earlier items of its group and of the allowed earlier
--            groups on its key); the caller derives the decision as for
--            ratelimit_token_bucket.lua (a cost above the burst, or wait +
--            n·T > tau with n > 0, is denied)
--   tat_i    that TAT and mark_i its mark (1: marked); wrote_i the TAT
--            item i left (tat_i when it wrote nothing): what a Cluster
--            cancel restores (ratelimit_settle.lua)
--   settled_s  the result of settle s, as ratelimit_settle.lua replies it
--
-- Writes, each key once at the end, whatever number of settles and
-- holds touched it (hflush, ratelimit_holds.lua): first what the settles
-- did (ratelimit_settle.lua), and the release of the expired holds of a
-- marked key (kept whatever the decisions). For each allowed group, every
-- held item (n = 0 included, so that its settle can charge) adds
-- ",<member>@<now+ttl>" to its key's holds, and its TAT' = now' + wait +
-- n·T for n > 0. A key with live holds is written marked, with them, and
-- a PX that outlives the TAT and its holds; a key that had no mark and
-- only fixed items charged as the buckets script writes it (compact when
-- the call reads TIME). A key that only fixed items of cost 0 touched is
-- not written, its mark included, as the buckets script leaves it. A
-- denied group writes nothing else.
if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end

local G = tonumber(ARGV[2])
local full = G < 0 -- the reply carries the TATs and marks (a Cluster cancel's)
if full then G = -G end
local N = 0
for g = 1, G do N = N + tonumber(ARGV[1 + 2 * g]) end
local reply = {now}

-- one MGET reads the bucket keys of the items and of the settles
local M = #KEYS
local cur = hmget(KEYS)

-- the reply's values, filled in order first so that they live in the
-- table's array part (the settles' results are set before the groups')
local NS = M - N
local R = 1 + G + N + NS
if full then R = R + 3 * N end
for j = 2, R do reply[j] = 0 end

-- each key's record (hstate, ratelimit_holds.lua): read once, written
-- once at the end (hflush), whatever number of settles and holds touch it
local S = {}

-- the settles that ride on the call: first, so that what follows sees
-- them
if NS > 0 then
  local b = 3 + 2 * G + 4 * N
  local r = 1 + G + N -- the reply's last value before the settles'
  if full then r = 1 + G + 4 * N end
  for s = 1, NS do
    local j = N + s
    local T, tau = ARGV[b] + 0, ARGV[b + 1] + 0
    local k = hstate(S, KEYS[j], cur[j], T, tau, now)
    reply[r + s] = hsettle(k, b, now, false, T, tau)
    b = b + 6
  end
end

-- The numbers of ARGV are read with '+ 0' (one conversion; tonumber makes
-- two): Go sends only numbers there.
local i = 0
local a = 3 + 2 * G -- the ARGV cursor of item i + 1
local lastexp, exps
for g = 1, G do
  local size, ttl = ARGV[1 + 2 * g] + 0, ARGV[2 + 2 * g] + 0
  local ok = true
  local i0, a0 = i, a
  for _ = 1, size do
    i = i + 1
    local key = KEYS[i]
    local T = ARGV[a] + 0
    local tau = ARGV[a + 1] + 0
    local n = ARGV[a + 2] + 0
    a = a + 4
    local k = S[key]
    if k == nil then
      local v = cur[i]
      -- hstate's plain-TAT branch, inline: a function call less per item on
      -- the common path (callgrind: 166k -> 162k instructions a request)
      local x = v and #v < 20 and tonumber(v)
      if x then
        x = tatof(key, x)
        k = {x, false, nil, false, now, false, tau, x, x, false, now, g, false, nil, false} -- hstate's, in slot order
        S[key] = k
      else
        k = hstate(S, key, v, T, tau, now)
        k[GROUP] = g
      end
    elseif k[GROUP] ~= g then -- its state before this group: a denial restores it
      k[GTAT], k[GMARKED], k[GTNOW], k[GROUP] = k[TAT], k[MARKED], k[TNOW], g
    end
    local tat, marked = k[TAT], k[MARKED]
    if full then reply[1 + G + 3 * N + i] = marked and 1 or 0 end
    local t = now -- hnow, inline: now (≥ 0) after the clamp
    if marked then
      if t < tat - 2 * tau then t = tat - 2 * tau end
    elseif t < tat - tau then
      t = tat - tau
    end
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
    if nt ~= tat then
      local h = k[HOLDS]
      k[MARKED] = (h ~= nil and h[LIVE] ~= '') or nt - t > tau -- live holds, or a debt
    end
    k[TAT], k[TNOW], k[TAU] = nt, t, tau
    reply[1 + G + i] = wait
    if full then
      reply[1 + G + N + i] = tat
      reply[1 + G + 2 * N + i] = nt
    end
  end
  if ok then
    local exp = now + ttl
    if exp ~= lastexp then lastexp, exps = exp, string.format('%d', exp) end
    for j = i0 + 1, i do
      local k = S[KEYS[j]]
      local member = ARGV[a0 + 4 * (j - i0 - 1) + 3]
      if member ~= '' then
        hadd(k, member, exp, exps) -- marked: a live hold (a later group's clamp is TAT - 2·tau)
      end
      k[DIRTY] = true
    end
  else
    for j = i0 + 1, i do
      local k = S[KEYS[j]]
      if k[GROUP] == g then
        k[TAT], k[MARKED], k[TNOW], k[GROUP] = k[GTAT], k[GMARKED], k[GTNOW], 0
      end
    end
  end
  reply[1 + g] = ok and 1 or 0
end

for j = 1, M do
  local key = KEYS[j]
  local k = S[key]
  if k[DIRTY] then hflush(key, k, now) end
end
return reply
