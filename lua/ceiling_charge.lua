-- ceiling_charge.lua: charge one shard of a sharded global-ceiling counter.
--
-- KEYS[1]  string counter of one shard for one window
-- ARGV[1]  increment (integer >= 1)
-- ARGV[2]  ttl in milliseconds (integer >= 1): how long the window's
--          counter must outlive the window (readers may lag behind)
--
-- Reply: the shard's count after the increment.
--
-- Writes: INCRBY on KEYS[1]; PEXPIRE ttl when this call created the key
-- (the count equals the increment), so a window's counter never lives
-- without a TTL and the TTL is not rewritten on every charge.
local n = redis.call("INCRBY", KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return n
