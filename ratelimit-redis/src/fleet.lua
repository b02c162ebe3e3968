-- ratelimit: one fleet sync's reports, many keys in one call (atomic: a
-- script runs alone). Each key is a gcra bucket with limit.lua's arithmetic,
-- and each report is limit.lua's "report": what a daemon admitted is added
-- to the key's debt, beyond empty if it comes to that (by at most a minute
-- of refill), and the debt after it is returned.
--
-- KEYS[1]      the tally: a sorted set of the units each key was admitted
--              this minute (for `ratelimit top --fleet`)
-- KEYS[2..]    the keys' buckets; on a Redis Cluster every key of a call is
--              in one slot (their hash tag is their group's)
-- ARGV[1]      deadline, microseconds on the server's clock (0: none): a
--              call reached later changes nothing and returns {-1, late_us}
-- ARGV[2]      the tally's time to live, ms
-- ARGV[3]      characters of each key before its name (the prefix and the
--              hash tag): the rest is its member in the tally
-- ARGV[4..]    five per key, in KEYS' order: s, p, b (gcra, reduced as in
--              limit.lua: time in units of 1/s microsecond, a token is p of
--              them, the bucket b tokens), the amount to add to the debt
--              (units, >= 0; 0 only reads it), and the units to tally (0:
--              none; a daemon tallies a key about once a second)
--
-- A key whose amount is 0 is read, not written: an idle key costs nothing
-- but the read.
--
-- Returns {now_us, debt_1, ..., debt_n}: each key's debt after its report,
-- in microseconds (rounded up): how long its bucket takes to be full again;
-- -2 for a key that is not a bucket (another program's key of that name),
-- which is left as it is.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local deadline = tonumber(ARGV[1]) or 0
if deadline > 0 and now > deadline then
  return {-1, now - deadline}
end

local ttl = tonumber(ARGV[2])
local skip = tonumber(ARGV[3])
local tally = KEYS[1]
local tallied = false

-- A bucket is one string, "s p b t d" (limit.lua's gcra fields: the
-- parameters, the time of the last write and the debt then), written with
-- its time to live: one read and one write a report, the least Redis can do.
local function report(key, s, p, b, amount)
  local st = redis.pcall('GET', key)
  if type(st) == 'table' and st.err then
    return -2
  end
  local tau = b * p
  local t = now
  local debt = 0
  if st then
    local ls, lp, lb, lt, ld = string.match(st, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    if not ls then
      return -2
    end
    ls, lp, lb, lt, ld = tonumber(ls), tonumber(lp), tonumber(lb), tonumber(lt), tonumber(ld)
    t, debt = gcra_debt(ls, lp, lb, lt, ld, s, p, b, now)
  end
  local d = debt + amount * p
  local most = tau + math.min(60000000 * s, 4503599627370496)
  if d > most then d = most end
  if amount > 0 then
    if d <= 0 then
      redis.call('DEL', key)
    else
      -- Full again d/s microseconds after t.
      redis.call('SET', key, string.format('%.0f %.0f %.0f %.0f %.0f', s, p, b, t, d))
      redis.call('PEXPIREAT', key, expiry(t, math.floor((d + s - 1) / s)))
    end
  end
  return math.floor((d + s - 1) / s)
end

local out = {now}
for i = 2, #KEYS do
  local a = 4 + (i - 2) * 5
  local s, p, b = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local amount, units = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local debt = report(KEYS[i], s, p, b, amount)
  out[i] = debt
  if debt ~= -2 and units > 0 then
    redis.pcall('ZINCRBY', tally, string.format('%.0f', units), string.sub(KEYS[i], skip + 1))
    tallied = true
  end
end
if tallied then
  redis.pcall('PEXPIRE', tally, ttl)
end
return out
