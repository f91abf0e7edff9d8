-- leader_acquire.lua: become the reconciler leader if nobody is, under a new fencing epoch.
--
-- KEYS[1] leader key   KEYS[2] leader epoch counter
-- ARGV[1] instance id   ARGV[2] lease ttl ms
-- Returns {1, value} when acquired (value = "<instance>:<epoch>"), {0, current value} otherwise.

local current = redis.call('GET', KEYS[1])
if current then return {0, current} end
local value = ARGV[1] .. ':' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {1, value}
