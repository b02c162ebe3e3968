-- ratelimit serve: acquires that hand out grants (many keys in one call),
-- refills bound to a grant, and the keyed refill of the open mode.
--
-- This text follows limit.lua wrapped as `local function limit(KEYS, ARGV)`
-- (see grant.rs): every decision and every write of a key's state is
-- limit.lua's; this file only adds the grants around them.
--
-- A grant is a string key beside its limit's key, in the same hash slot:
--   KEY .. ':g:' .. ID  =  "a x y z t d n u r e"  (space-separated)
--   a x y z   the limit it was taken under (limit.lua's algorithm and numbers)
--   t d       gcra: the time of the grant (µs) and the key's debt right after
--             it (units of 1/x µs): the grant's units are the last of that
--             debt, so they have all come back by themselves at t + d/x;
--             windows: t is the window's index, d is 0
--   n         units it took
--   u         units the caller has said were unused (what refills named, at
--             most n): refunds only ever raise it, so a retry refunds nothing
--   r         gcra: the key's refunded debt (field R) when the grant was made
--   e         the key's epoch (field e) when the grant was made: a key that
--             was deleted (full) and made again ends every older grant
--   o         who may refill it (the service's word for the caller's tenant;
--             `-` for none): a refill by another is refused (a record
--             without it, from before owners, is anyone's)
-- It expires when its units would be back by themselves (gcra) or its window
-- ends: past that a refund could only give units that were never taken.
--
-- The key's state gains two fields beside limit.lua's: R, the debt given back
-- by grant refills (so that a later grant's units, which moved up when an
-- earlier one's were given back, are not counted twice), and e, its epoch.
--
-- ARGV[1] operation, ARGV[2] deadline (µs on the server's clock, 0: none; a
-- call reached later changes nothing and returns {-1, late_us, now_us}).
-- limit.lua reads the clock itself: an acquire reads it once a key.
--
-- "acquire": KEYS = limit key, grant key (per item); ARGV[3..] per item:
--   mode ("partial" | "take"), algorithm, x, y, z, amount, grant id ("" for
--   no grant), owner. Returns per item {allowed, granted, remaining,
--   retry_us}, then now_us.
-- "refill": KEYS = limit key, grant key; ARGV[3] = units of the grant unused
--   in all, ARGV[4] = the owner asking. Returns {code, refunded, remaining,
--   taken, unused, now_us}; code 1 done, 0 no such grant (expired or never
--   made), 2 the key's limit changed since the grant (nothing refunded), 3
--   the grant is another owner's (nothing refunded).
-- "refund": KEYS = key; ARGV[3..7] = algorithm ("stored": the key's own), x,
--   y, z, amount. Returns {code, refunded, remaining, now_us}; code 1 done, 2
--   the key was written under another limit (nothing refunded); remaining -1
--   when the key has no state and no limit was named.

local op = ARGV[1]
local deadline = tonumber(ARGV[2]) or 0

local function late(now)
  return {-1, now - deadline, now}
end

local function int(v)
  return string.format('%.0f', v)
end

local function capacity(algo, x, y, z)
  if algo == 'gcra' then return tonumber(z) end
  return tonumber(x)
end

-- Whole units there now, without writing (limit.lua answers an amount past
-- the capacity with what is there, and saves nothing).
local function there(key, algo, x, y, z)
  local r = limit({key}, {'take', algo, x, y, z, capacity(algo, x, y, z) + 1, 0})
  return r[3]
end

local function split(s)
  local out = {}
  for w in string.gmatch(s, '%S+') do out[#out + 1] = w end
  return out
end

if op == 'acquire' then
  local out = {}
  local now = 0
  local n = (#ARGV - 2) / 8
  for i = 0, n - 1 do
    local a = 3 + i * 8
    local mode, algo = ARGV[a], ARGV[a + 1]
    local x, y, z = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
    local amount, id = tonumber(ARGV[a + 5]), ARGV[a + 6]
    local key, gkey = KEYS[i * 2 + 1], KEYS[i * 2 + 2]
    -- The first key checks the deadline (limit.lua reads the clock once a
    -- key): past it, nothing is written; once it passed, the call runs
    -- whole.
    local r = limit({key}, {mode, algo, x, y, z, amount, i == 0 and deadline or 0})
    if r[1] == -1 then return late(r[5]) end
    now = r[5]
    if r[2] > 0 and id ~= '' then
      -- Written from the strings at hand: formatting numbers costs Redis
      -- more than the rest of the record.
      local f = redis.call('HMGET', key, 't', 'd', 'R', 'e', 'i')
      -- No state: it expired as it was written (Redis ran this script
      -- late), so the units are back already; the record says so.
      local gone = not (f[1] or f[5])
      local epoch = f[4]
      if not epoch then
        epoch = id
        if not gone then redis.call('HSET', key, 'e', epoch) end
      end
      local t, d, at
      if algo == 'gcra' then
        t, d = f[1] or int(now), f[2] or '0'
        -- The grant's units are back by themselves when the debt is gone.
        at = expiry(tonumber(t), math.floor((tonumber(d) + x - 1) / x))
      else
        t, d = f[5] or int(math.floor(now / y)), '0'
        at = expiry((tonumber(t) + 1) * y, 0)
      end
      local rec = table.concat({algo, ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], t, d,
        tostring(r[2]), '0', f[3] or '0', epoch, ARGV[a + 7]}, ' ')
      redis.call('SET', gkey, rec)
      redis.call('PEXPIREAT', gkey, at)
    end
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
    out[#out + 1] = r[4]
  end
  out[#out + 1] = now
  return out
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if deadline > 0 and now > deadline then
  return late(now)
end

if op == 'refill' then
  local key, gkey = KEYS[1], KEYS[2]
  local unused = tonumber(ARGV[3])
  local raw = redis.call('GET', gkey)
  if not raw then return {0, 0, -1, 0, 0, now} end
  local g = split(raw)
  if g[11] and g[11] ~= ARGV[4] then return {3, 0, -1, 0, 0, now} end
  local algo, x, y, z = g[1], tonumber(g[2]), tonumber(g[3]), tonumber(g[4])
  local gt, gd, taken, said = tonumber(g[5]), tonumber(g[6]), tonumber(g[7]), tonumber(g[8])
  local gr, ge = tonumber(g[9]), g[10]
  local want = math.min(unused, taken) - said
  local function record(u)
    g[8] = int(u)
    redis.call('SET', gkey, table.concat(g, ' '), 'KEEPTTL')
  end
  local st = redis.call('HMGET', key, 'a', 'x', 'y', 'z', 'R', 'e', 'i')
  if not st[1] then
    -- Full (or an empty window): nothing to give back.
    if want > 0 then record(said + want) end
    return {1, 0, capacity(algo, x, y, z), taken, math.max(said, math.min(unused, taken)), now}
  end
  if st[1] ~= algo or tonumber(st[2]) ~= x or tonumber(st[3]) ~= y or tonumber(st[4]) ~= z then
    return {2, 0, there(key, st[1], st[2], st[3], st[4]), taken, said, now}
  end
  if algo == 'gcra' then
    -- Given back exactly: the part of the grant's units still in the debt
    -- (they are its last; an earlier grant's refill moved them up by R).
    local f = redis.call('HMGET', key, 't', 'd')
    local lt, ld = tonumber(f[1]), tonumber(f[2])
    local t = now
    if lt > now then t = lt end
    local debt = ld - (t - lt) * x
    if debt < 0 then debt = 0 end
    local tau = z * y
    local before = math.floor((tau - debt) / y)
    local credit = 0
    if want > 0 and st[6] == ge then
      local elapsed = now - gt
      if elapsed < 0 then elapsed = 0 end
      local tail = gd - elapsed * x - ((tonumber(st[5]) or 0) - gr)
      credit = math.min(want * y, tail, debt)
    end
    local d = debt
    if credit > 0 then
      d = debt - credit
      if d <= 0 then
        redis.call('DEL', key)
        d = 0
      else
        hwrite(key, expiry(t, math.floor((d + x - 1) / x)), 't', int(t), 'd', int(d),
          'R', int((tonumber(st[5]) or 0) + credit))
      end
    end
    if want > 0 then record(said + want) end
    local after = math.floor((tau - d) / y)
    return {1, after - before, after, taken, math.max(said, said + want), now}
  end
  -- A window's grant is given back within its own window only.
  local before = there(key, algo, x, y, z)
  local after = before
  if want > 0 and st[6] == ge and tonumber(st[7]) == gt then
    after = limit({key}, {'refund', algo, x, y, z, want, 0})[3]
  end
  if want > 0 then record(said + want) end
  return {1, after - before, after, taken, math.max(said, said + want), now}
end

if op == 'refund' then
  local key = KEYS[1]
  local algo, x, y, z = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
  local amount = tonumber(ARGV[7])
  local st = redis.call('HMGET', key, 'a', 'x', 'y', 'z')
  if not st[1] then
    if algo == 'stored' then return {1, 0, -1, now} end
    return {1, 0, capacity(algo, x, y, z), now}
  end
  if algo == 'stored' then
    algo, x, y, z = st[1], st[2], st[3], st[4]
  elseif st[1] ~= algo or tonumber(st[2]) ~= tonumber(x) or tonumber(st[3]) ~= tonumber(y)
      or tonumber(st[4]) ~= tonumber(z) then
    return {2, 0, there(key, st[1], st[2], st[3], st[4]), now}
  end
  local before = there(key, algo, x, y, z)
  local r = limit({key}, {'refund', algo, x, y, z, amount, 0})
  local got = r[3] - before
  if got > amount then got = amount end
  if algo == 'gcra' and got > 0 and r[3] < tonumber(z) then
    -- Every grant's units moved up by what was given back.
    redis.call('HINCRBY', key, 'R', int(got * tonumber(y)))
  end
  return {1, got, r[3], now}
end

return redis.error_reply('ratelimit: unknown operation ' .. tostring(op))
