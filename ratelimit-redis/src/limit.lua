-- ratelimit: one key's limit, decided in Redis (atomic: a script runs alone).
--
-- KEYS[1]  the key, with its {hash tag}
-- ARGV[1]  operation: "take" (all or nothing), "partial" (what is there),
--          "refund" (give back), "charge" (take whether or not it is there),
--          "report" (gcra: add what was admitted elsewhere, beyond empty if
--          it comes to that, by at most a minute of refill; amount may be 0)
-- ARGV[2]  algorithm: "gcra", "fixed", "sliding"; "stored" (refund only):
--          whatever the key was written with
-- ARGV[3..5]
--   gcra:    s (tokens), p (per p microseconds), b (burst); all reduced by
--            their common divisor. Time is kept in units of 1/s microsecond,
--            where one token is p units and the whole bucket b*p units.
--   fixed, sliding: l (limit), w (window, microseconds), unused
-- ARGV[6]  amount (whole units, >= 1)
-- ARGV[7]  deadline, microseconds on the server's clock (0: none): a call
--          reached later changes nothing and returns {-1, 0, 0, late_us, now_us}
--          (the client gave up on it, or is about to)
--
-- "probe" (health checks): writes KEYS[1] for a minute, as a decision would
-- write its key, so that it fails when decisions fail.
--
-- The state is a hash: a (algorithm), and
--   gcra:    s p b, t (microseconds of the last write), d (debt at t, in
--            units of 1/s microsecond: how far the bucket is below full)
--   fixed:   l w, i (window index), c (count in it)
--   sliding: l w, i (window index), q (count in the previous), c (current)
-- A state of another algorithm or other parameters is converted (gcra: its
-- debt in time, rounded up, capped at the new bucket) or, for windows of
-- another length, started afresh. A full bucket or an empty window is no key:
-- every write sets a TTL at which the state would read as that.
--
-- Every number stays an integer below 2^53, so Lua's doubles are exact; the
-- client refuses parameters that could leave that range.
--
-- Returns {allowed, granted, remaining, retry_us, now_us}; retry_us is -1
-- when the amount can never be granted at once, 0 when it was granted; for
-- "report" it is the debt after it, in microseconds (rounded up): how long
-- the bucket takes to be full again.

local key = KEYS[1]
local op, algo = ARGV[1], ARGV[2]
local x, y, z = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local amount = tonumber(ARGV[6])

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local deadline = tonumber(ARGV[7] or '0') or 0
if deadline > 0 and now > deadline then
  return {-1, 0, 0, now - deadline, now}
end

if op == 'probe' then
  redis.call('SET', key, now, 'PX', 60000)
  return {1, 0, 0, 0, now}
end

local function int(v)
  return string.format('%.0f', v)
end

local st = redis.call('HMGET', key, 'a', 'x', 'y', 'z', 't', 'd', 'i', 'q', 'c')

-- A refund that does not name its limit uses the one the key was written with.
if algo == 'stored' then
  if not st[1] then return {1, 0, 0, 0, now} end
  algo = st[1]
  x, y, z = tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
end

if algo == 'gcra' then
  local s, p, b = x, y, z
  local tau = b * p
  local t = now
  local debt = 0
  if st[1] == 'gcra' then
    local ls, lp, lb = tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
    local lt, ld = tonumber(st[5]), tonumber(st[6])
    t, debt = gcra_debt(ls, lp, lb, lt, ld, s, p, b, now)
  end
  local function save(d)
    if d <= 0 then
      redis.call('DEL', key)
    else
      -- Full again d/s microseconds after t.
      hwrite(key, expiry(t, math.floor((d + s - 1) / s)), 'a', 'gcra', 'x', int(s),
        'y', int(p), 'z', int(b), 't', int(t), 'd', int(d))
    end
  end
  local function left(d)
    if p == 0 then return 0 end
    return math.floor((tau - d) / p)
  end
  if op == 'refund' then
    local d = debt - amount * p
    if amount >= b then d = 0 end
    if d < 0 then d = 0 end
    save(d)
    return {1, amount, left(d), 0, now}
  end
  if op == 'report' then
    local d = debt + amount * p
    local most = tau + math.min(60000000 * s, 4503599627370496)
    if d > most then d = most end
    save(d)
    return {1, amount, left(math.min(d, tau)), math.floor((d + s - 1) / s), now}
  end
  if op == 'charge' then
    local d = debt + amount * p
    if amount >= b or d > tau then d = tau end
    save(d)
    return {1, amount, left(d), 0, now}
  end
  if b > 0 and amount <= b and debt + amount * p <= tau then
    save(debt + amount * p)
    return {1, amount, left(debt + amount * p), 0, now}
  end
  local have = left(debt)
  local retry = -1
  if b > 0 and amount <= b then
    retry = math.floor((debt + amount * p - tau + s - 1) / s)
  end
  if op == 'partial' and have > 0 then
    local give = have
    if give > amount then give = amount end
    save(debt + give * p)
    return {0, give, have - give, retry, now}
  end
  return {0, 0, have, retry, now}
end

-- Windows: fixed and sliding.
local l, w = x, y
local index = math.floor(now / w)
local prev, cur = 0, 0
if st[1] == algo and tonumber(st[3]) == w then
  local li = tonumber(st[7])
  if li == index then
    prev, cur = tonumber(st[8]) or 0, tonumber(st[9])
  elseif li == index - 1 then
    prev = tonumber(st[9])
  elseif li > index then
    -- A clock stepped back: the later window stays.
    index = li
    prev, cur = tonumber(st[8]) or 0, tonumber(st[9])
  end
end
if algo == 'fixed' then prev = 0 end
local into = now - index * w
if into > w then into = w end
if into < 0 then into = 0 end

-- Budget in units of count*microsecond: the previous window weighs what is
-- left of it.
local budget = l * w
local function used(c)
  return prev * (w - into) + c * w
end
local function room(c)
  local u = used(c)
  if u >= budget then return 0 end
  return math.floor((budget - u) / w)
end
local function save(c)
  if c <= 0 and prev <= 0 then
    redis.call('DEL', key)
    return
  end
  -- Nothing of this window weighs after its end (sliding: the next one's).
  local horizon = (index + 1) * w
  if algo == 'sliding' then horizon = horizon + w end
  hwrite(key, expiry(horizon, 0), 'a', algo, 'x', int(l), 'y', int(w),
    'z', '0', 'i', int(index), 'q', int(prev), 'c', int(c))
end

if op == 'refund' then
  local c = cur - amount
  if c < 0 then c = 0 end
  save(c)
  return {1, amount, room(c), 0, now}
end
if op == 'charge' then
  local c = cur + amount
  if c > l then c = l end
  save(c)
  return {1, amount, room(c), 0, now}
end
if amount <= l and used(cur) + amount * w <= budget then
  save(cur + amount)
  return {1, amount, room(cur + amount), 0, now}
end
local have = room(cur)
local retry = -1
if amount <= l then
  local ready
  if algo == 'fixed' or cur + amount > l then
    -- Only the next window (and, sliding, the weight of this one in it).
    if algo == 'fixed' or cur == 0 then
      ready = (index + 1) * w
    else
      local need = (cur + amount - l) * w
      ready = (index + 1) * w + math.floor((need + cur - 1) / cur)
    end
  else
    local need = used(cur) + amount * w - budget
    ready = index * w + into + math.floor((need + prev - 1) / prev)
  end
  retry = ready - now
  if retry < 1 then retry = 1 end
end
if op == 'partial' and have > 0 then
  local give = have
  if give > amount then give = amount end
  save(cur + give)
  return {0, give, have - give, retry, now}
end
return {0, 0, have, retry, now}
