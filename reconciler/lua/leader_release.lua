-- leader_release.lua: give up the leader lease (graceful stop) if it is still ours.
--
-- KEYS[1] leader key
-- ARGV[1] our value
-- Returns 1 released | 0 it was not ours.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
