-- ratelimit: the daemons of a fleet, each with a lease on the server's clock
-- (never the daemons' own clocks, which may be wrong by seconds).
--
-- KEYS[1]  a sorted set: member -> when it last renewed (ms, server's clock)
-- ARGV[1]  the member
-- ARGV[2]  "renew" (the member syncs now) or "leave" (it stops for good: its
--          program went with it)
-- ARGV[3]  the lease, ms: a member that has not renewed for this long is
--          past its lease (dead or cut off; its program may still enforce)
-- ARGV[4]  silence, ms: a member counted whose last renewal is older than
--          this is "silent" (cut off, or dead)
-- ARGV[5]  the grace, ms (at least the lease): a member that has not left is
--          counted this long after its last renewal, past its lease too, so
--          that a program still enforcing without its daemon keeps its share
--          (a host gone for good is forgotten after it)
--
-- Returns {members, silent, past_lease}: the members counted, how many of
-- them are silent, and how many of those are past their lease.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key, member = KEYS[1], ARGV[1]
local lease, silence = tonumber(ARGV[3]), tonumber(ARGV[4])
local grace = math.max(tonumber(ARGV[5]) or lease, lease)

if ARGV[2] == 'leave' then
  redis.call('ZREM', key, member)
else
  redis.call('ZADD', key, string.format('%.0f', now), member)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. string.format('%.0f', now - grace))
local n = redis.call('ZCARD', key)
local silent = redis.call('ZCOUNT', key, '-inf', '(' .. string.format('%.0f', now - silence))
local past = redis.call('ZCOUNT', key, '-inf', '(' .. string.format('%.0f', now - lease))
if n > 0 then
  redis.call('PEXPIRE', key, grace * 2)
end
return {n, silent, past}
