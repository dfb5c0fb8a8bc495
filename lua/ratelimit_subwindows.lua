-- ratelimit_subwindows.lua: the state helpers of the bucketed sliding
-- window (ratelimit.SlidingWindowBuckets), prepended by lua/ratelimit.go to
-- ratelimit_batch.lua and ratelimit_refund.lua.
--
-- A key holds "h:c0:c1:…:cN": h the index of its newest sub-window (of
-- width P/N µs, sub-window j = [j·P/N, (j+1)·P/N)), c[i] the count of
-- sub-window h − i, a zero written as nothing ("2800:3:::1:"). bparse
-- reads it: h and the counts (1-based, newest first), or 0, nil when the
-- value is not that with exactly N+1 counts (written under another N, or
-- by something else), which the scripts read as no state.
local function bparse(s, N)
  local h, rest = string.match(s, '^(%d+):([%d:]*)$')
  if h == nil then return 0, nil end
  local c, i = {}, 0
  for f in string.gmatch(rest .. ':', '(%d*):') do
    i = i + 1
    if i > N + 1 then return 0, nil end
    c[i] = tonumber(f) or 0
  end
  if i ~= N + 1 then return 0, nil end
  return tonumber(h), c
end


-- bformat writes h and the counts c (1-based, newest first) as bparse
-- reads them; the second result says whether any count is above 0.
local function bformat(h, c)
  local parts, any = {string.format('%d', h)}, false
  for i = 1, #c do
    if c[i] > 0 then
      parts[i + 1], any = string.format('%d', c[i]), true
    else
      parts[i + 1] = ''
    end
  end
  return table.concat(parts, ':'), any
end
