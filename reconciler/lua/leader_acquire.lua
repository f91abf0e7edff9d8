-- leader_acquire.lua: become the reconciler leader if nobody is, under a new fencing epoch.
--
--! keys: reconciler_leader reconciler_epoch
-- ARGV[1] instance id   ARGV[2] lease ttl ms
-- Returns {1, value} when acquired (value = "<instance>:<epoch>"), {0, current value} otherwise.

local current = redis.call('GET', K_RECONCILER_LEADER)
if current then return {0, current} end
local value = ARGV[1] .. ':' .. redis.call('INCR', K_RECONCILER_EPOCH)
redis.call('SET', K_RECONCILER_LEADER, value, 'PX', ARGV[2])
return {1, value}
