-- ratelimit_refund.lua: give back what ratelimit_batch.lua charged, on the
-- rare Redis Cluster path where one slot group of a batch was charged and
-- another group denied (or failed). It is the only second round trip.
--
-- KEYS[i]  the state key of item i (all in one Cluster slot)
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2 + 8(i-1) .. 9 + 8(i-1)], for item i: alg, L, P, B, T, n, uid,
--          mark: the item exactly as it was sent to ratelimit_batch.lua,
--          plus the mark that call returned for it
--
-- Reply: the number of items refunded exactly.
--
-- Writes, per algorithm (an item that cannot be refunded exactly is left
-- as it is: never give back more than was taken):
--   bucket family  TAT -= n·T; the key is deleted when that leaves the
--                  bucket full, else its TTL is reset to TAT - now
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
for i = 1, #KEYS do
  local key = KEYS[i]
  local b = 2 + 8 * (i - 1)
  local alg = tonumber(ARGV[b])
  local T = tonumber(ARGV[b + 4])
  local n = tonumber(ARGV[b + 5])
  local uid = ARGV[b + 6]
  local mark = tonumber(ARGV[b + 7])
  if n > 0 then
    if alg == 0 or alg == 1 or alg == 5 then
      local tat = tonumber(redis.pcall('GET', key))
      if tat ~= nil then
        tat = tat - n * T
        if tat <= now then
          redis.call('DEL', key)
        else
          redis.call('SET', key, fmt('%d', tat), 'PX', floor((tat - now + 999) / 1000))
        end
        refunded = refunded + 1
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
