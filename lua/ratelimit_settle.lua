-- ratelimit_settle.lua: settle, the second half of reserve-then-settle
-- (ratelimit.Hold.Settle on a RedisStore): replace each item's hold by its
-- actual cost, at most once per hold. Also the cancel of a Cluster
-- reserve whose other slot group was denied. The arithmetic is
-- ratelimit/hold.go (heldSettle) line by line; the helpers and the layout
-- of holds are ratelimit_holds.lua.
--
-- KEYS[2i-1]  item i's bucket key K ("<tat>" or "<tat>h<n>:<last>")
-- KEYS[2i]    K..":h", its holds and tombstones (sorted set)
--             All keys hash to one Cluster slot; a key may repeat.
-- ARGV[1]  now in µs, or "" to read Redis TIME
-- ARGV[2]  0 to settle; 1 to cancel: undo a reserve without leaving
--          tombstones, restoring the TAT and mark exactly when the key
--          still holds what the reserve wrote
-- then, for item i, 10 values:
--          T, tau  the emission interval and Burst·T in µs (tau ≤ 2^51)
--          est     the estimate held; actual the actual cost (≤ est +
--                  2·Burst: Go caps it, beyond which the debt is at its
--                  bound anyway; 0 when cancelling)
--          member  "<hold id>/<i>=<est>", the hold; "" for an item its
--                  reservation charged without holding it (a fixed
--                  item: only cancelled, its cost given back as a
--                  hold's estimate would be)
--          tomb    "<hold id>/<i>", its tombstone
--          exp     the hold's release time (µs), the tombstone's score
--          old, wrote, mark  cancel only: the TAT the reserve saw and
--                  wrote, and the mark it saw (1: marked)
--
-- Reply: one integer per item: 1 applied, 2 already settled (its
-- tombstone is there: a second settle, or the retry of one whose reply
-- was lost, until the hold's release time), 3 expired (the hold was
-- released, or its key reset, or the tombstone ended).
--
-- Writes, per item in order (in reverse order for a cancel, so that two
-- items on one key each find what the other left): the release of what
-- ended in K..":h" (as every script touching a marked key does; a settle
-- on any key, a cancel never); then (a settle) ZADD of the tombstone at
-- exp, which K..":h"'s TTL already covers while the hold is live; then, if
-- the hold is live: ZREM of it; TAT' from δ = actual − est (t = now after
-- the clamp): δ < 0 gives |δ|·T back, TAT' = max(TAT − |δ|·T, t) while TAT
-- > t; δ > 0 charges TAT' = min(max(TAT, t) + δ·T, t + 2·tau), at most
-- one burst of debt; the key written with its mark (live holds or TAT' −
-- t > tau) and a PX that outlives both. An already settled hold changes
-- nothing else; an expired one takes its tombstone back.
holdslib()
local now = tonumber(ARGV[1])
if now == nil then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
elseif now < 0 then
  now = 0
end
local cancel = ARGV[2] == '1'

local N = #KEYS / 2
local reply = {}
local from, to, step = 1, N, 1
if cancel then from, to, step = N, 1, -1 end -- a cancel undoes last first
for i = from, to, step do
  reply[i] = hsettle(KEYS[2 * i - 1], 3 + 10 * (i - 1), now, cancel)
end
return reply
