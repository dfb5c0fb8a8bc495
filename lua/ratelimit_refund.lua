-- ratelimit_refund.lua: give back what ratelimit_batch.lua or
-- ratelimit_buckets.lua charged, on the rare Redis Cluster (Ring) path
-- where one slot group of a batch was charged and another group denied (or
-- failed). It is the only second round trip.
--
-- KEYS[i]  the state key of item i (all in one Cluster slot)
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2 + 9(i-1) .. 10 + 9(i-1)], for item i: alg, L, P, B, T, n, uid,
--          mark, wrote: the item exactly as it was sent to the charging
--          script, the mark that call returned for it (bucket family: the
--          TAT before the charge, 0 for none; windows: the window index
--          written) and, for the bucket family, the TAT' the charge wrote
--          (0 otherwise)
--
-- Reply: the number of items given back (a bucket item counts only when
-- restored exactly).
--
-- Items are undone last first, so that two items of the group on one key
-- each find the state the other left. Writes, per algorithm (an item that
-- cannot be refunded exactly is never given back more than it took):
--   bucket family  when the key still holds TAT' (nothing wrote it since
--                  the charge, or what did was undone): the TAT from before
--                  the charge, exactly, as the memory store's rollback of a
--                  denied batch leaves it. The key is deleted when there
--                  was no state; else the TAT is set back keeping the
--                  charge's TTL (which ends after that TAT: the state is
--                  full by then), even when it is at or before now: a clock
--                  that then goes backwards is clamped by it
--                  (algorithms.go), so forgetting it would give more room
--                  than the memory store. When another charge landed in
--                  between: TAT -= n·T (not exact); the key is deleted when
--                  that leaves the bucket full, else its TTL is reset to
--                  TAT - now
--   fixed window   count -= n if the window is still the charged one (mark)
--   window counter cur -= n in the charged window, or prev -= n once the
--                  charged window has become the previous one
--   window log     ZREM of the members the charge added
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
  local b = 2 + 9 * (i - 1)
  local alg = tonumber(ARGV[b])
  local T = tonumber(ARGV[b + 4])
  local n = tonumber(ARGV[b + 5])
  local uid = ARGV[b + 6]
  local mark = tonumber(ARGV[b + 7])
  local wrote = tonumber(ARGV[b + 8])
  if n > 0 then
    if alg == 0 or alg == 1 or alg == 5 then
      local cur = tonumber(redis.pcall('GET', key))
      if cur ~= nil then
        local tat = cur - n * T
        local exact = cur == wrote
        if exact then tat = mark end
        if tat <= 0 or (not exact and tat <= now) then
          redis.call('DEL', key)
        elseif exact then
          redis.call('SET', key, fmt('%d', tat), 'KEEPTTL')
        else
          redis.call('SET', key, fmt('%d', tat), 'PX', floor((tat - now + 999) / 1000))
        end
        if exact then refunded = refunded + 1 end
      end
    elseif alg == 2 then
      local s = redis.pcall('GET', key)
      if type(s) == 'string' then
        local ks, cs = string.match(s, '^(%d+):(%d+)$')
        ks, cs = tonumber(ks), tonumber(cs)
        if ks ~= nil and ks == mark and cs >= n then
          if cs == n then
            redis.call('DEL', key)
          else
            redis.call('SET', key, fmt('%d:%d', ks, cs - n), 'KEEPTTL')
          end
          refunded = refunded + 1
        end
      end
    elseif alg == 4 then
      local s = redis.pcall('GET', key)
      if type(s) == 'string' then
        local ks, ps, cs = string.match(s, '^(%d+):(%d+):(%d+)$')
        ks, ps, cs = tonumber(ks), tonumber(ps), tonumber(cs)
        if ks ~= nil then
          if ks == mark and cs >= n then
            cs = cs - n
          elseif ks == mark + 1 and ps >= n then
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
          refunded = refunded + 1
        end
      end
    elseif alg == 3 then
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
    end
  end
end
return refunded
