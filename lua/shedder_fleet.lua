-- shedder_fleet.lua: report one server's in-flight work per priority and
-- read the fleet's (the fleet usage load shedder).
--
-- KEYS[1]  hash: field = server id, value = "c0:c1:c2:c3" or
--          "c0:c1:c2:c3:r", the in-flight cost of that server per priority
--          (Sheddable … CriticalPlus) and its reservation
-- KEYS[2]  sorted set: member = server id, score = when its report
--          expires (ms)
-- KEYS[3]  hash: fields "0".."3" = the sum over live servers, "r" the
--          sum of their reservations, kept incrementally so a report
--          costs O(log N), not O(N)
-- KEYS[4]  sorted set: member = the id of a server that refused Critical
--          (or CriticalPlus) work since its previous report, score = when
--          that stops counting (ms): its report's expiry
-- ARGV[1]  server id
-- ARGV[2..5]  this server's in-flight cost per priority (integers >= 0)
-- ARGV[6]  ttl in ms (integer >= 1): the report counts this long; 0 removes
--          the server (it is leaving the fleet)
-- ARGV[7]  now in ms from the client clock, or "" to read Redis TIME
-- ARGV[8]  optional: the fleet threshold (integer >= 0) up to which this
--          server reserves headroom; absent or 0 reserves nothing
-- ARGV[9]  optional: the fleet's capacity (integer >= 1), for the share
-- ARGV[10] optional: uniform in [0, 1), rounds the reservation
-- ARGV[11] optional: the carry (integer >= 0), how far the server may
--          still grow beyond this report under its previous reservation
--          until it reads this reply: at least that much stays reserved
-- ARGV[12] optional: "1" when this server refused Critical or
--          CriticalPlus work since its previous report while below its
--          even share of the capacity (the client decides), else "0"
--
-- Reservations: with ARGV[8] > 0 the server reserves, beyond its report,
-- its share of the threshold's headroom, floor(share * (T - U) + round),
-- where U is the fleet's in-flight cost with this report and share is
-- (own + capacity/n) / (U + capacity); the reservation is stored with the
-- report (a fifth field) and counts until the server's next report.
-- What is stored is the larger of that and the carry (ARGV[11]): work the
-- server admitted under its old reservation while this report was on its
-- way counts until its next report; the reply's reservation is the share
-- alone, so a carry lasts one interval.
-- Reports without a fifth field reserve nothing.
--
-- Pressure: a server that refused Critical work is in KEYS[4] until its
-- next report without a refusal (or its report's expiry, if it stops
-- reporting); the reply says whether another server is, so that the
-- servers above their even share stop admitting lower priorities until
-- it is served.
--
-- Reply: {t0, t1, t2, t3, servers, reservedOthers, reserved, pressure}
--   t0..t3          the fleet's in-flight cost per priority, this report
--                   included
--   servers         live servers, this one included unless it left
--   reservedOthers  the other live servers' reservations
--   reserved        this server's reservation (0 without ARGV[8])
--   pressure        1 when another live server refused Critical work at
--                   its last report (KEYS[4]), else 0
--
-- Writes: replaces this server's report; reaps up to 100 reports that
-- expired (servers that crashed or stopped reporting), subtracting them
-- from the sums; rebuilds the sums from the reports when the sums key is
-- missing (evicted); adds or removes this server in KEYS[4]. All four keys
-- expire when the last live report does,
-- so an abandoned fleet leaves nothing behind.
local reports, expiry, sums, wants = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local new = {tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])}
local ttl = tonumber(ARGV[6])
local now
if ARGV[7] == "" then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[7])
end

local target = tonumber(ARGV[8] or "0") or 0
local fcap = tonumber(ARGV[9] or "1") or 1
local round = tonumber(ARGV[10] or "0") or 0
local carry = tonumber(ARGV[11] or "0") or 0
local want = ttl > 0 and ARGV[12] == "1"

-- parse returns the five counts of a report (the reservation 0 when the
-- report has none), or nil when it is malformed.
local function parse(v)
  if not v then return nil end
  local a, b, c, d, r = string.match(v, "^(%d+):(%d+):(%d+):(%d+):?(%d*)$")
  if not a then return nil end
  return {tonumber(a), tonumber(b), tonumber(c), tonumber(d), tonumber(r) or 0}
end
local fields = {"0", "1", "2", "3", "r"}

local rebuild = redis.call("EXISTS", sums) == 0

local function subtract(counts)
  if rebuild or not counts then return end
  for i = 1, 5 do
    if counts[i] ~= 0 then redis.call("HINCRBY", sums, fields[i], -counts[i]) end
  end
end

-- Reap expired reports.
local expired = redis.call("ZRANGEBYSCORE", expiry, "-inf", now, "LIMIT", 0, 100)
for _, sid in ipairs(expired) do
  if sid ~= id then
    subtract(parse(redis.call("HGET", reports, sid)))
    redis.call("HDEL", reports, sid)
    redis.call("ZREM", expiry, sid)
  end
end

-- Replace this server's report (its reservation, if any, is added below).
subtract(parse(redis.call("HGET", reports, id)))
if ttl > 0 then
  redis.call("HSET", reports, id, table.concat(new, ":"))
  redis.call("ZADD", expiry, now + ttl, id)
  if not rebuild then
    for i = 1, 4 do
      if new[i] ~= 0 then redis.call("HINCRBY", sums, fields[i], new[i]) end
    end
  end
else
  redis.call("HDEL", reports, id)
  redis.call("ZREM", expiry, id)
end

if rebuild then
  local total = {0, 0, 0, 0, 0}
  local all = redis.call("HGETALL", reports)
  for i = 1, #all, 2 do
    local score = redis.call("ZSCORE", expiry, all[i])
    local counts = parse(all[i + 1])
    if counts and score and tonumber(score) > now then
      for j = 1, 5 do total[j] = total[j] + counts[j] end
    else
      redis.call("HDEL", reports, all[i])
      redis.call("ZREM", expiry, all[i])
    end
  end
  redis.call("HSET", sums, "0", total[1], "1", total[2], "2", total[3], "3", total[4], "r", total[5])
end

local out = redis.call("HMGET", sums, "0", "1", "2", "3", "r")
for i = 1, 5 do
  local v = tonumber(out[i]) or 0
  if v < 0 then
    -- Only a key evicted under memory pressure can cause this; repair it.
    redis.call("HSET", sums, fields[i], 0)
    v = 0
  end
  out[i] = v
end
local others = out[5]

-- This server's reservation: its share of the threshold's headroom.
local mine = 0
local n = redis.call("ZCARD", expiry)
if ttl > 0 and target > 0 then
  local used = out[1] + out[2] + out[3] + out[4]
  local own = new[1] + new[2] + new[3] + new[4]
  local head = target - used
  if head > 0 then
    local share = (own + fcap / math.max(n, 1)) / (used + fcap)
    mine = math.floor(share * head + round)
    if mine > head then mine = head end
  end
  local stored = math.max(mine, carry)
  if stored > 0 then
    new[5] = stored
    redis.call("HSET", reports, id, table.concat(new, ":"))
    redis.call("HINCRBY", sums, "r", stored)
  end
end

-- Pressure: this server's refusal of Critical work, and the others'.
-- With nobody in KEYS[4] (the common case) that is one ZREM and one
-- EXISTS.
local pressure = 0
local anyWants = want
if want then
  redis.call("ZADD", wants, now + ttl, id)
else
  anyWants = redis.call("ZREM", wants, id) == 1 or redis.call("EXISTS", wants) == 1
end
if anyWants then
  local live = redis.call("ZCOUNT", wants, "(" .. now, "+inf")
  if want then live = live - 1 end
  if live > 0 then pressure = 1 end
  redis.call("ZREMRANGEBYSCORE", wants, "-inf", now)
end

local last = redis.call("ZRANGE", expiry, -1, -1, "WITHSCORES")
if #last == 0 then
  redis.call("DEL", reports, expiry, sums, wants)
else
  local pttl = math.max(tonumber(last[2]) - now, 1)
  redis.call("PEXPIRE", reports, pttl)
  redis.call("PEXPIRE", expiry, pttl)
  redis.call("PEXPIRE", sums, pttl)
  if anyWants then redis.call("PEXPIRE", wants, pttl) end
end
out[5] = n
out[6] = others
out[7] = mine
out[8] = pressure
return out
