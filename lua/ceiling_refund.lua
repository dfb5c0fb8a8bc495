-- ceiling_refund.lua: take back a charge of ceiling_charge.lua after the
-- admission that made it was denied.
--
-- KEYS[1]  the shard counter that was charged
-- ARGV[1]  amount to take back: a decimal integer string >= 1, passed to
--          DECRBY as it is (never a Lua number)
--
-- Reply: the shard's count after the refund as a decimal string (exact
-- for any int64), or -1 when the key no longer exists (the window
-- expired; nothing to take back).
--
-- Writes: DECRBY on KEYS[1] only when it exists, so a late refund never
-- creates a counter without a TTL.
if redis.call("EXISTS", KEYS[1]) == 0 then
  return -1
end
redis.call("DECRBY", KEYS[1], ARGV[1])
return redis.call("GET", KEYS[1])
