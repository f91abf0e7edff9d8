-- update_session.lua: fenced HSET of worker-maintained fields of the session hash.
--
-- KEYS[1] lease:{sess}   KEYS[2] sess:{sess}
-- ARGV[1] lease value   then field, value pairs
-- Returns 1 written | 0 lost (nothing written)

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
return 1
