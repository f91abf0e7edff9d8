-- leader_renew.lua: extend the leader lease if it is still ours.
--
--! keys: reconciler_leader
-- ARGV[1] our value   ARGV[2] lease ttl ms
-- Returns 1 renewed | 0 lost (expired, or another instance leads).

if redis.call('GET', K_RECONCILER_LEADER) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', K_RECONCILER_LEADER, ARGV[2])
return 1
