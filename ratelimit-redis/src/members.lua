-- ratelimit: the daemons of a fleet, each with a lease on the server's clock
-- (never the daemons' own clocks, which may be wrong by seconds).
--
-- KEYS[1]  a sorted set: member -> when it last renewed (ms, server's clock)
-- ARGV[1]  the member
-- ARGV[2]  "renew" (the member syncs now) or "leave" (it stops for good)
-- ARGV[3]  the lease, ms: a member that has not renewed for this long is no
--          longer counted
-- ARGV[4]  silence, ms: a member counted whose last renewal is older than
--          this is "silent" (cut off, or dead, while its lease lasts)
--
-- Returns {members, silent}: the members counted (with leases running),
-- and how many of them are silent.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key, member = KEYS[1], ARGV[1]
local lease, silence = tonumber(ARGV[3]), tonumber(ARGV[4])

if ARGV[2] == 'leave' then
  redis.call('ZREM', key, member)
else
  redis.call('ZADD', key, string.format('%.0f', now), member)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%.0f', now - lease))
local n = redis.call('ZCARD', key)
local silent = redis.call('ZCOUNT', key, '-inf', '(' .. string.format('%.0f', now - silence))
if n > 0 then
  redis.call('PEXPIRE', key, lease * 2)
end
return {n, silent}
