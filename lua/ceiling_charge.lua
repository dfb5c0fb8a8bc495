-- ceiling_charge.lua: charge one shard of a sharded global-ceiling counter.
--
-- KEYS[1]  string counter of one shard for one window
-- ARGV[1]  increment: a decimal integer string >= 1, passed to INCRBY as
--          it is (its Lua number, which rounds above 2^53, is only compared
--          with the count to spot a new key)
-- ARGV[2]  ttl in milliseconds (integer >= 1): how long the window's
--          counter must outlive the window (readers may lag behind)
--
-- Reply: the shard's count after the increment, exact for any int64: an
-- integer below 2^53 (where a Lua number is exact), else the decimal
-- string GET returns (a count through a Lua number would be rounded above
-- 2^53, and 2^63 came back negative). INCRBY fails with "increment or
-- decrement would overflow" instead of wrapping; nothing is written then.
--
-- Writes: INCRBY on KEYS[1]; PEXPIRE ttl when this call created the key
-- (the count equals the increment: equal integers are equal numbers), so
-- a window's counter never lives without a TTL and the TTL is not
-- rewritten on every charge.
local n = redis.call("INCRBY", KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
if n < 9007199254740992 and n > -9007199254740992 then
  return n
end
return redis.call("GET", KEYS[1])
