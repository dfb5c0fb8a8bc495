-- ceiling_charge.lua: charge one shard of a sharded global-ceiling counter.
--
-- KEYS[1]  string counter of one shard for one window
-- ARGV[1]  increment: a decimal integer string >= 1, passed to INCRBY as
--          it is (never converted to a Lua number, which would round it
--          above 2^53)
-- ARGV[2]  ttl in milliseconds (integer >= 1): how long the window's
--          counter must outlive the window (readers may lag behind)
--
-- Reply: the shard's count after the increment, as a decimal string (a
-- bulk reply read with GET): exact for any int64, where a count returned
-- through a Lua number would be rounded above 2^53 and could come back
-- negative. INCRBY fails with "increment or decrement would overflow"
-- instead of wrapping, and then nothing is written.
--
-- Writes: INCRBY on KEYS[1]; PEXPIRE ttl when the key has no TTL (this
-- call created it), so a window's counter never lives without a TTL and
-- the TTL is not rewritten on every charge.
redis.call("INCRBY", KEYS[1], ARGV[1])
if redis.call("PTTL", KEYS[1]) == -1 then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return redis.call("GET", KEYS[1])
