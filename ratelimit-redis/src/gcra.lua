-- ratelimit: the gcra debt a bucket carries, shared by limit.lua and
-- fleet.lua (each script is this file followed by its own).
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
