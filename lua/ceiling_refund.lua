-- ceiling_refund.lua: take back a charge of ceiling_charge.lua after the
-- admission that made it was denied.
--
-- KEYS[1]  the shard counter that was charged
-- ARGV[1]  amount to take back: a decimal integer string >= 1, passed to
--          DECRBY as it is (never a Lua number)
--
-- Reply: the shard's count after the refund (an integer below 2^53 in
-- magnitude, else the exact decimal string), or -1 when the key no longer
-- exists (the window expired; nothing to take back).
--
-- Writes: DECRBY on KEYS[1] only when it exists, so a late refund never
-- creates a counter without a TTL; a counter back to 0 is deleted, so a
-- denied admission that created its shard leaves no key behind (the state
-- is what it was before, byte for byte; a missing shard reads as 0).
if redis.call("EXISTS", KEYS[1]) == 0 then
  return -1
end
local n = redis.call("DECRBY", KEYS[1], ARGV[1])
if n == 0 then
  redis.call("DEL", KEYS[1])
end
if n < 9007199254740992 and n > -9007199254740992 then
  return n
end
return redis.call("GET", KEYS[1])
