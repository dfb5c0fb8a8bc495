-- ratelimit_batch.lua: decide N rate-limit items in one round trip, all or
-- nothing per group (a caller's batch; several callers' batches coalesced
-- into one call are several groups). The arithmetic is ratelimit/algorithms.go line by line (the
-- memory store runs that file; a differential test compares the two).
--
-- KEYS[i]  the state key of item i. All keys of one call hash to one
--          Cluster slot (the Go store groups items by slot).
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2 .. 2+G]  only when the call has several groups (#ARGV ≠ 1 + 7N):
--          G, then the number of items of each group, in KEYS order (they
--          sum to N = #KEYS). Without them the call is one group of N.
-- then, for item i, 7 values:
--          alg  the algorithm's name, as ratelimit.Algorithm's String
--               spells it: token_bucket, gcra, leaky_bucket (the bucket
--               family, decided alike), fixed_window, sliding_window_log,
--               sliding_window_counter, sliding_window_buckets (a Go test,
--               TestScriptAlgorithmNames, checks that the scripts and Go
--               agree on these names)
--          L    limit; P period in µs; B burst (effective, ≥ 1)
--          T    emission interval ceil(P/L) in µs
--               (sliding_window_buckets: B is N, the sub-windows per period, P a multiple
--               of N; T is the mode, 1 conservative, 0 interpolated)
--          n    cost (≥ 0; 0 peeks; ≤ capacity+1 ≤ 2^52+1, exact: Go sends a larger cost as capacity+1)
--          uid  unique id of this item in this call: the sliding window
--               log's members are uid (n = 1) or uid..":"..j (j = 1..n);
--               sliding_window_buckets: "1" asks for the counts the item saw (for a refund)
--
-- Reply: {now, allowed, then 7 integers per item: ok, remaining, reset,
--         retry, s1, s2, s3}
--   now        the µs time the call decided at
--   allowed    1 if every group was allowed (and so charged), else 0; a
--              group is allowed iff all its items are ok
--   ok         1 if the item alone had room (0 peeks always do)
--   remaining  what is left, counted as if charged when ok
--   reset      µs until the state is back to full (also its key's TTL)
--   retry      µs until the item can succeed; 0 when ok, and 0 with ok = 0
--              when n exceeds the capacity (the Go side reports that as
--              ReasonCostExceedsLimit)
--   s1 s2 s3   the state the item saw, before its charge (including the
--              charges of earlier items of its group, and of allowed
--              earlier groups, on its key), which a
--              Cluster refund restores (ratelimit_refund.lua); with now,
--              the caller recomputes the state the item wrote. Bucket
--              family: TAT, mark (1: marked by holds or a debt), 0 (TAT
--              0: no state); fixed window: w,
--              count, 0; window counter: w, prev, cur (all 0: no state);
--              log: 0, 0, 0
--
-- State, one key per item:
--   bucket family   the TAT (µs), encoded as ratelimit_holds.lua says
--   fixed window    string "w:count"       (w = window index)
--   window counter  string "w:prev:cur"
--   window log      zset member -> admission time (µs)
--   bucketed window string: h (the newest sub-window) and c[0..N], c[i]
--                   the count of sub-window h − i, packed as
--                   ratelimit_subwindows.lua says; a value of another
--                   length (another N or limit) reads as empty
--
-- Groups are decided in order, each exactly as if it were a call of its
-- own made after the previous ones: a denied group charges nothing and
-- changes nothing a later group sees.
--
-- Writes: phase 1 only reads, except that it trims the log's expired
-- entries (as the memory store does on every call; that changes no
-- decision) and releases the expired holds of a bucket key marked by
-- holds or a debt ("<tat>h…": see ratelimit_holds.lua, whose clamp TAT −
-- 2·tau and reply range [0, 2·tau] for wait such a key follows). Phase 2 writes each item with n > 0 of every allowed group,
-- in order, with a PX TTL of ceil(reset/1000) ms ≥ 1 (a plain TAT of the
-- bucket family as ratelimit_token_bucket.lua writes it): past it the
-- state is full and a missing key means the same. A denied group changes
-- no state. A key of unexpected type or content (the policy
-- changed algorithm) reads as empty and is overwritten. Two items on one
-- key see each other's charge. Numbers sent to redis.call are formatted
-- with %d: Lua's default %.14g would round 16-digit microsecond times.
local floor = math.floor
local fmt = string.format

local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
if now < 0 then now = 0 end

local function ttl(reset) -- ms, rounded up, at least 1
  local m = floor((reset + 999) / 1000)
  if m < 1 then m = 1 end
  return m
end

-- the smallest x ≥ 0 with floor(p·(P−x)/P) ≤ m (m ≥ 0)
local function drain(p, m, P)
  if p <= m then return 0 end
  return floor(((p - m - 1) * P + 1 + p - 1) / p)
end

-- The bucketed window (sliding_window_buckets), ratelimit/algorithms.go's bucketsDecide
-- (bparse, bformat: ratelimit_subwindows.lua). bshift moves the counts c
-- (1-based, newest first) sh sub-windows on, in place (a fresh table of
-- zeros for no state): a[i+1] is then a(i). bwt is the oldest
-- sub-window's weight, bzero the smallest x ≥ x0 at which that weight is
-- ≤ m, breset the time from e until every count weighs 0.
local function bshift(c, sh, N)
  if c == nil or sh > N then
    c = {}
    for i = 1, N + 1 do c[i] = 0 end
  elseif sh > 0 then
    for i = N + 1, sh + 1, -1 do c[i] = c[i - sh] end
    for i = 1, sh do c[i] = 0 end
  end
  return c
end

local function bwt(c, e, W, cons)
  if cons then
    if e < W - 1 then return c end
    return 0
  end
  return floor(c * (W - e) / W)
end

local function bzero(c, m, x0, W, cons)
  if bwt(c, x0, W, cons) <= m then return x0 end
  if cons then return W - 1 end
  local x = drain(c, m, W)
  if x < x0 then x = x0 end
  return x
end

local function breset(a, N, W, cons, e)
  for i = 1, N + 1 do
    if a[i] > 0 then
      local r = (N + 1 - i) * W + bzero(a[i], 0, 0, W, cons) - e
      if r < 0 then r = 0 end
      return r
    end
  end
  return 0
end

local N = #KEYS
local sizes, first = {N}, 2 -- group sizes; ARGV index of item 1's alg
if #ARGV ~= 1 + 7 * N then
  local G = tonumber(ARGV[2])
  sizes, first = {}, 3 + G
  for g = 1, G do sizes[g] = tonumber(ARGV[2 + g]) end
end

-- committed: what allowed earlier groups wrote; gp, gl, gw: the same for
-- the current group, merged into the committed ones when it is allowed
local pending = {} -- key -> state string written
local logs = {}    -- key -> {n added, at}
local writes = {}
local gp, gl, gw
local reply = {now, 1}
local extra = {} -- the counts sliding_window_buckets items saw, when asked

-- hl: a marked bucket key's {live holds, last end} (ratelimit_holds.lua),
-- set at its touches; rewritten: its state after its first touch released
-- expired holds
local hl, rewritten = {}, {}

local function getstr(key)
  local v = gp[key]
  if v == nil then v = pending[key] end
  if v == nil then v = rewritten[key] end
  if v ~= nil then return v end
  v = redis.pcall('GET', key)
  if type(v) ~= 'string' then return nil end
  return v
end

local i = 0
for g = 1, #sizes do
  gp, gl, gw = {}, {}, {}
  local all = 1
  for _ = 1, sizes[g] do
    i = i + 1
    local key = KEYS[i]
    local b = first + 7 * (i - 1)
    local alg = ARGV[b]
    local L = tonumber(ARGV[b + 1])
    local P = tonumber(ARGV[b + 2])
    local B = tonumber(ARGV[b + 3])
    local T = tonumber(ARGV[b + 4])
    local n = tonumber(ARGV[b + 5])
    local ok, rem, reset, retry, s1, s2, s3 = 0, 0, 0, 0, 0, 0, 0

    if alg == 'token_bucket' or alg == 'gcra' or alg == 'leaky_bucket' then
      local tau = B * T
      local s = getstr(key)
      local tat, marked, h = s and tonumber(s), false, nil
      if tat ~= nil then
        tat = tatof(key, tat)
      else
        tat = 0
        if s then
          if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
          tat, marked, h = hparse(s, key)
        end
      end
      if marked and hl[key] == nil then
        -- first touch of a key with holds or a debt (ratelimit_holds.lua):
        -- release its expired holds, kept whatever the decisions
        local t0 = hnow(tat, now, tau, true)
        local changed
        tat, changed = hreap(h, tat, t0, now, T)
        if changed then
          local px
          rewritten[key], px, marked = hvalue(tat, t0, now, tau, h)
          hset(key, rewritten[key], px)
        end
      end
      if marked then hl[key] = h end
      s1 = tat
      if marked then s2 = 1 end
      local t = now -- time went backwards: clamped to TAT - tau (2·tau marked)
      if marked then
        if t < tat - 2 * tau then t = tat - 2 * tau end
      elseif t < tat - tau then
        t = tat - tau
      end
      local base = tat
      if base < t then base = t end
      local wait = base - t
      local room = tau - wait
      if room < 0 then room = 0 end
      if n > B or (n > 0 and wait + n * T > tau) then
        rem, reset = floor(room / T), wait
        if n <= B then retry = (wait - tau) + n * T end
      else
        local need = wait + n * T
        ok, rem, reset = 1, floor((tau - need) / T), need
        if rem < 0 then rem = 0 end
        if n > 0 then
          local plain = t + need
          local s = fmt('%d', plain)
          local px = ttl(need)
          local h = hl[key]
          if h ~= nil then
            s, px = hvalue(plain, t, now, tau, h)
            plain = nil
          end
          gp[key] = s
          gw[#gw + 1] = {0, key, s, px, plain}
        end
      end

    elseif alg == 'fixed_window' then
      local w, c = 0, 0
      local s = getstr(key)
      if s ~= nil then
        local ws, cs = string.match(s, '^(%d+):(%d+)$')
        if ws ~= nil then w, c = tonumber(ws), tonumber(cs) end
      end
      s1, s2 = w, c
      local t = now
      if t < w * P then t = w * P end -- time went backwards: stay in the window
      local k = floor(t / P)
      if k ~= w then c = 0 end
      local wend = (k + 1) * P
      if n > L or c + n > L then
        rem = L - c
        if rem < 0 then rem = 0 end
        if c > 0 then reset = wend - t end
        if n <= L then retry = wend - t end
      else
        c = c + n
        ok, rem = 1, L - c
        if c > 0 then reset = wend - t end
        if n > 0 then
          local v = fmt('%d:%d', k, c)
          gp[key] = v
          gw[#gw + 1] = {0, key, v, ttl(reset)}
        end
      end

    elseif alg == 'sliding_window_counter' then
      local w, prev, cur = 0, 0, 0
      local s = getstr(key)
      if s ~= nil then
        local ws, ps, cs = string.match(s, '^(%d+):(%d+):(%d+)$')
        if ws ~= nil then w, prev, cur = tonumber(ws), tonumber(ps), tonumber(cs) end
      end
      s1, s2, s3 = w, prev, cur
      local t = now
      if t < w * P then t = w * P end
      local k = floor(t / P)
      if k == w + 1 then
        prev, cur = cur, 0
      elseif k ~= w then
        prev, cur = 0, 0
      end
      local e = t - k * P
      local est = floor(prev * (P - e) / P) + cur
      if n > L or est + n > L then
        rem = L - est
        if rem < 0 then rem = 0 end
        if n <= L then
          if L - cur - n >= 0 then
            retry = drain(prev, L - cur - n, P) - e
          else
            retry = (P - e) + drain(cur, L - n, P)
          end
        end
      else
        ok, rem = 1, L - est - n
        cur = cur + n
      end
      if cur > 0 then
        reset = (P - e) + drain(cur, 0, P)
      else
        reset = drain(prev, 0, P) - e
        if reset < 0 then reset = 0 end
      end
      if ok == 1 and n > 0 then
        local v = fmt('%d:%d:%d', k, prev, cur)
        gp[key] = v
        gw[#gw + 1] = {0, key, v, ttl(reset)}
      end

    elseif alg == 'sliding_window_log' then
      local zkey = true -- false: the key holds another type, replace it
      local c, newest = 0, nil
      local lg = gl[key]
      if lg == nil then lg = logs[key] end
      local top = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
      if top.err then
        zkey = false
      elseif top[2] ~= nil then
        newest = tonumber(top[2])
      end
      if lg ~= nil then newest = lg[2] end
      local t = now
      if newest ~= nil and t < newest then t = newest end -- time went backwards
      local cutoff = t - P -- entries ≤ cutoff have left the window
      local stored = 0
      if zkey and top[2] ~= nil then
        -- trimmed on every call, as the memory store does (it changes no
        -- decision, and the newest entry it keeps bounds a backwards clock)
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt('%d', cutoff))
        stored = redis.call('ZCARD', key)
      end
      local added = 0
      if lg ~= nil then added = lg[1] end
      c = stored + added
      if n > L or c + n > L then
        rem = L - c
        if rem < 0 then rem = 0 end
        if n <= L then
          -- the m-th oldest live entry must leave first
          local m = c + n - L
          if m <= stored then
            local r = redis.call('ZRANGE', key, m - 1, m - 1, 'WITHSCORES')
            retry = tonumber(r[2]) + P - t
          else
            retry = lg[2] + P - t
          end
        end
      else
        ok, rem = 1, L - c - n
        c = c + n
        if n > 0 then
          newest = t
          gl[key] = {added + n, t}
          gw[#gw + 1] = {1, key, ARGV[b + 6], n, t, zkey}
        end
      end
      if c > 0 then reset = newest + P - t end
      if ok == 1 and n > 0 then gw[#gw][7] = ttl(reset) end
    elseif alg == 'sliding_window_buckets' then
      local NB, cons = B, T == 1
      local W = P / NB
      local h, c = 0, nil
      local s = getstr(key)
      if s ~= nil then h, c = bparse(s, NB, L) end
      if c == nil then h = 0 end
      s1 = h
      if ARGV[b + 6] == '1' then
        for j = 1, NB + 1 do extra[#extra + 1] = c and c[j] or 0 end
      end
      local t = now
      if t < h * W then t = h * W end -- time went backwards: stay in the sub-window
      local k = floor(t / W)
      local e = t - k * W
      local a = bshift(c, k - h, NB)
      local full = 0
      for j = 1, NB do full = full + a[j] end
      local est = full + bwt(a[NB + 1], e, W, cons)
      if n > L or est + n > L then
        rem = L - est
        if rem < 0 then rem = 0 end
        if n <= L then
          local x0, f = e, full
          for j = 0, NB do
            local m = L - n - f
            if m >= 0 then
              retry = j * W + bzero(a[NB + 1 - j], m, x0, W, cons) - e
              break
            end
            f = f - a[NB - j]
            x0 = 0
          end
        end
      else
        ok, rem = 1, L - est - n
        a[1] = a[1] + n
      end
      reset = breset(a, NB, W, cons, e)
      if ok == 1 and n > 0 then
        local v = bformat(k, a, NB, L)
        gp[key] = v
        gw[#gw + 1] = {0, key, v, ttl(reset)}
      end
    else
      return redis.error_reply('ERR unknown algorithm ' .. tostring(ARGV[b]))
    end

    if ok == 0 then all = 0 end
    local o = #reply
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4] = ok, rem, reset, retry
    reply[o + 5], reply[o + 6], reply[o + 7] = s1, s2, s3
  end
  if all == 1 then
    for k, v in pairs(gp) do pending[k] = v end
    for k, v in pairs(gl) do logs[k] = v end
    for _, w in ipairs(gw) do writes[#writes + 1] = w end
  else
    reply[2] = 0
  end
end

local replaced = {} -- log keys of another type already replaced
for _, w in ipairs(writes) do
  if w[1] == 0 and w[5] then
    tatset(w[2], w[5], w[4]) -- a plain TAT (ratelimit_holds.lua)
  elseif w[1] == 0 then -- a marked TAT (hvalue), or a window's state
    redis.call('SET', w[2], w[3], 'PX', w[4])
  else
    local key, uid, n, at, zkey, px = w[2], w[3], w[4], w[5], w[6], w[7]
    if not zkey and not replaced[key] then redis.call('DEL', key) end
    replaced[key] = true
    local score = fmt('%d', at)
    if n == 1 then
      redis.call('ZADD', key, score, uid)
    else
      local args = {}
      for j = 1, n do
        args[#args + 1] = score
        args[#args + 1] = uid .. ':' .. j
        if #args >= 1000 or j == n then
          redis.call('ZADD', key, unpack(args))
          args = {}
        end
      end
    end
    redis.call('PEXPIRE', key, px)
  end
end
for _, x in ipairs(extra) do reply[#reply + 1] = x end
return reply
