-- leader_release.lua: give up the leader lease (graceful stop) if it is still ours.
--
--! keys: reconciler_leader
-- ARGV[1] our value
-- Returns 1 released | 0 it was not ours.

if redis.call('GET', K_RECONCILER_LEADER) ~= ARGV[1] then return 0 end
redis.call('DEL', K_RECONCILER_LEADER)
return 1
