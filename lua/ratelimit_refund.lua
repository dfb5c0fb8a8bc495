-- ratelimit_refund.lua: give back what ratelimit_batch.lua or
-- ratelimit_buckets.lua charged, on the rare Redis Cluster (Ring) path
-- where one slot group of a batch was charged and another group denied (or
-- failed). It is the only second round trip.
--
-- KEYS[i]  the state key of item i (all in one Cluster slot)
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2 + 10(i-1) .. 11 + 10(i-1)], for item i:
--          alg  the algorithm's name, as sent to the charging script
--               (ratelimit_batch.lua lists them)
--          T    the emission interval in µs; n the cost; uid the log's id
--               as sent
--          o1 o2 o3  the state the item saw before its charge, as the
--               charging script replied it: TAT, mark, 0 (bucket family;
--               TAT 0: no state; mark 1: marked by holds or a debt); w, count, 0 (fixed window); w, prev, cur
--               (window counter); unused for the log
--          w1 w2 w3  the state the charge wrote, in the same form (the Go
--               side recomputes it with algorithms.go from o and the
--               charge's now)
--          sliding_window_buckets: uid is the value before the charge
--               ("" for none), o1 the sub-window charged, o2 N, o3 the
--               limit L, w1 the value the charge wrote
--               (ratelimit_subwindows.lua)
--
-- Reply: the number of items restored exactly to the state before their
-- charge.
--
-- Items are undone last first, so that two items of the group on one key
-- each find the state the other left. Writes, per algorithm:
--   bucket family,  when the key still holds w (nothing wrote it since the
--   fixed window,   charge, or what did was undone): o, exactly, as the
--   window counter  memory store's rollback of a denied batch leaves it.
--                   The key is deleted when o is no state; else o is set
--                   back keeping the charge's TTL (which ends after o is
--                   full), even when o is full already: a clock that then
--                   goes backwards is clamped by it (algorithms.go), so
--                   forgetting it would give more room than the memory
--                   store does. With Redis TIME a plain TAT is written
--                   compact, as the hot paths write it ("r" PXAT E,
--                   ratelimit_holds.lua): the very bytes and expiry the
--                   key had before the charge (a key whose expiry E has
--                   passed meanwhile ends, as it would have).
--   A key marked by holds or a debt ("<tat>h…", ratelimit_holds.lua) is
--   restored the same way but keeps its mark and TTL; otherwise it gets
--   TAT = max(TAT − n·T, now) while TAT > now.
--   otherwise (another charge landed in between; never more than n is
--   given back):
--     bucket family  TAT -= n·T; the key is deleted when that leaves the
--                    bucket full, else written with its TTL to TAT − now
--                    (compact with Redis TIME)
--     fixed window   count -= n if the window is still the charged one
--     window counter cur -= n in the charged window, or prev -= n once the
--                    charged window has become the previous one
--   bucketed window  the value before the charge (deleted when none),
--                    keeping the TTL, when the key still holds what the
--                    charge wrote; else n off the charged sub-window's count
--                    while the key still has it (deleted when all counts
--                    are 0)
--   window log       ZREM of the members the charge added (exact)
-- A missing key (expired, reset) is left missing.
local floor = math.floor
local fmt = string.format

local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
if now < 0 then now = 0 end

local refunded = 0
for i = #KEYS, 1, -1 do
  local key = KEYS[i]
  local b = 2 + 10 * (i - 1)
  local alg = ARGV[b]
  local T = tonumber(ARGV[b + 1])
  local n = tonumber(ARGV[b + 2])
  local uid = ARGV[b + 3]
  local o1, o2, o3 = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  local w1, w2, w3 = tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8]), tonumber(ARGV[b + 9])
  if n > 0 then
    if alg == 'token_bucket' or alg == 'gcra' or alg == 'leaky_bucket' then
      local v = redis.pcall('GET', key)
      local cur, marked, h = tonumber(v), false, nil
      if cur ~= nil then
        cur = tatof(key, cur)
      else
        if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
        local c, m, hh = hparse(v, key)
        if m then cur, marked, h = c, true, hh end
      end
      if marked then
        -- a key with holds or a debt (ratelimit_holds.lua) keeps its mark
        -- and holds (or gets back the mark it had) and its TTL, which
        -- outlives its holds
        local tat, mark = o1, true
        if cur == w1 then
          refunded = refunded + 1
          mark = o2 == 1
        else
          tat = cur
          if tat > now then
            tat = tat - n * T
            if tat < now then tat = now end
          end
        end
        redis.call('SET', key, (hvalue(tat, 0, 0, 0, h, true, mark)), 'KEEPTTL')
      elseif cur ~= nil then
        if cur == w1 then
          if o2 == 1 then
            -- the charge unmarked the key: restore its mark with it
            if hparse == nil then hparse, hnow, hreap, hvalue, hset, hwrite, hstate, hadd, hflush, hsettle, hmget = holdslib() end
            redis.call('SET', key, (hvalue(o1, 0, 0, 0, nil, true, true)), 'KEEPTTL')
          elseif o1 <= 0 then
            redis.call('DEL', key)
          elseif compact then
            -- as the hot paths wrote it: "r" PXAT E, the very bytes and
            -- expiry the key had before the charge
            tatset(key, o1)
          else
            redis.call('SET', key, fmt('%d', o1), 'KEEPTTL')
          end
          refunded = refunded + 1
        else
          local tat = cur - n * T
          if tat <= now then
            redis.call('DEL', key)
          else
            tatset(key, tat, floor((tat - now + 999) / 1000))
          end
        end
      end
    elseif alg == 'fixed_window' then
      local s = redis.pcall('GET', key)
      if type(s) == 'string' then
        local ks, cs = string.match(s, '^(%d+):(%d+)$')
        ks, cs = tonumber(ks), tonumber(cs)
        if ks ~= nil and ks == w1 and cs == w2 then
          if o1 == 0 and o2 == 0 then
            redis.call('DEL', key)
          else
            redis.call('SET', key, fmt('%d:%d', o1, o2), 'KEEPTTL')
          end
          refunded = refunded + 1
        elseif ks ~= nil and ks == w1 and cs >= n then
          if cs == n then
            redis.call('DEL', key)
          else
            redis.call('SET', key, fmt('%d:%d', ks, cs - n), 'KEEPTTL')
          end
        end
      end
    elseif alg == 'sliding_window_counter' then
      local s = redis.pcall('GET', key)
      if type(s) == 'string' then
        local ks, ps, cs = string.match(s, '^(%d+):(%d+):(%d+)$')
        ks, ps, cs = tonumber(ks), tonumber(ps), tonumber(cs)
        if ks ~= nil and ks == w1 and ps == w2 and cs == w3 then
          if o1 == 0 and o2 == 0 and o3 == 0 then
            redis.call('DEL', key)
          else
            redis.call('SET', key, fmt('%d:%d:%d', o1, o2, o3), 'KEEPTTL')
          end
          refunded = refunded + 1
        else
          if ks ~= nil then
            if ks == w1 and cs >= n then
              cs = cs - n
            elseif ks == w1 + 1 and ps >= n then
              ps = ps - n
            else
              ks = nil
            end
          end
          if ks ~= nil then
            if ps == 0 and cs == 0 then
              redis.call('DEL', key)
            else
              redis.call('SET', key, fmt('%d:%d:%d', ks, ps, cs), 'KEEPTTL')
            end
          end
        end
      end
    elseif alg == 'sliding_window_buckets' then
      local s = redis.pcall('GET', key)
      if type(s) == 'string' then
        local old, wrote = ARGV[b + 3], ARGV[b + 7]
        if s == wrote then
          if old == '' then
            redis.call('DEL', key)
          else
            redis.call('SET', key, old, 'KEEPTTL')
          end
          refunded = refunded + 1
        else
          local NB, L = o2, o3
          local h, c = bparse(s, NB, L)
          local j = h - o1
          if c ~= nil and j >= 0 and j <= NB and c[j + 1] >= n then
            c[j + 1] = c[j + 1] - n
            local any = false
            for x = 1, NB + 1 do any = any or c[x] > 0 end
            if any then
              redis.call('SET', key, bformat(h, c, NB, L), 'KEEPTTL')
            else
              redis.call('DEL', key)
            end
          end
        end
      end
    elseif alg == 'sliding_window_log' then
      local members = {}
      if n == 1 then
        members[1] = uid
      else
        for j = 1, n do members[j] = uid .. ':' .. j end
      end
      local removed = 0
      for j = 1, #members, 1000 do
        local r = redis.pcall('ZREM', key, unpack(members, j, math.min(j + 999, #members)))
        if type(r) == 'number' then removed = removed + r end
      end
      if removed == n then refunded = refunded + 1 end
    else
      return redis.error_reply('ERR unknown algorithm ' .. tostring(alg))
    end
  end
end
return refunded
