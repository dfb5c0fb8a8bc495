-- ratelimit_subwindows.lua: the state helpers of the bucketed sliding
-- window (ratelimit.SlidingWindowBuckets), prepended by lua/ratelimit.go to
-- ratelimit_batch.lua and ratelimit_refund.lua.
--
-- A key holds h, the index of its newest sub-window (of width P/N µs,
-- sub-window j = [j·P/N, (j+1)·P/N)), and c[0..N], c[i] the count of
-- sub-window h − i, packed big-endian (struct.pack): h in 7 bytes, then
-- each count in w bytes, w the smallest of 1, 2, 4 and 7 that holds the
-- limit L (a count never exceeds L): 7 + (N+1)·w bytes, 18 for N = 10
-- and L < 256. Packing and unpacking are one C call each, where a
-- decimal "h:c0:…" took a string.format and a tonumber per count.
--
-- bparse reads it: h and the counts (1-based, newest first), or 0, nil
-- when the value does not have the length of N and L (written under
-- another policy, or by something else), which the scripts read as no
-- state. bformat writes it.
local bfmts = {} -- N·8 + w -> the counts' struct format

local function bfmt(N, L)
  local w = 7
  if L < 256 then
    w = 1
  elseif L < 65536 then
    w = 2
  elseif L < 4294967296 then
    w = 4
  end
  local f = bfmts[N * 8 + w]
  if f == nil then
    f = '>' .. string.rep('I' .. w, N + 1)
    bfmts[N * 8 + w] = f
  end
  return f, 7 + (N + 1) * w
end

local function bparse(s, N, L)
  local f, len = bfmt(N, L)
  if #s ~= len then return 0, nil end
  local h = struct.unpack('>I7', s)
  local c = {struct.unpack(f, s, 8)}
  c[N + 2] = nil -- unpack's next position
  return h, c
end

local function bformat(h, c, N, L)
  return struct.pack('>I7', h) .. struct.pack((bfmt(N, L)), unpack(c, 1, N + 1))
end
