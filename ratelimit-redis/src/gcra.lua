-- ratelimit: what limit.lua, serve.lua and fleet.lua share (each script is
-- this file followed by its own): the gcra debt a bucket carries, and how a
-- state hash is written with its TTL.
--
-- ls, lp, lb, lt, ld: the bucket as last written (its s, p, b, the time of
-- the write, microseconds, and the debt then, units); s, p, b: the limit
-- now; now: Redis's clock, microseconds. Returns t, the time the bucket is
-- judged at (the later of now and its last write: a clock stepped back never
-- refills), and the debt at t, in the limit's units now: a debt written
-- under other parameters is carried over in microseconds, rounded up, at
-- most a bucket.
local function gcra_debt(ls, lp, lb, lt, ld, s, p, b, now)
  local t = now
  if lt > now then t = lt end
  local debt = 0
  local gone = (t - lt) * ls
  if gone < ld then debt = ld - gone end
  if debt > 0 and (ls ~= s or lp ~= p or lb ~= b) then
    local us = math.floor((debt + ls - 1) / ls)
    debt = us * s
    if debt > b * p then debt = b * p end
  end
  return t, debt
end

-- When a state judged at `t` (microseconds, Redis's clock) is worthless `us`
-- microseconds later, as PEXPIREAT takes it: absolute milliseconds, two
-- past. A relative TTL is counted by Redis from a time it took before the
-- script ran (behind by as long as the script has run, or longer), and
-- PEXPIREAT deletes a key whose time is not after the current millisecond:
-- a TTL of 1 ms deleted the state at once. One millisecond is for the
-- rounding down, one for that.
local function expiry(t, us)
  return math.floor((t + us) / 1000) + 2
end

-- Writes the fields `...` of the hash `key`, to expire at `at` (see
-- expiry). HSET keeps a key's old expiry, and Redis checks expiry on each
-- command: an old one that passed right after the HSET makes PEXPIREAT find
-- the key expired and delete it, with the fields just written (it answers
-- 0). Then they are written again, on a key with no old expiry.
local function hwrite(key, at, ...)
  redis.call('HSET', key, ...)
  if redis.call('PEXPIREAT', key, at) == 0 then
    redis.call('HSET', key, ...)
    redis.call('PEXPIREAT', key, at)
  end
end
