-- update_session.lua: fenced HSET of worker-maintained fields of the session hash.
--
-- ARGV[1] lease value   ARGV[2] session   then field, value pairs
-- Returns 1 written | 0 lost (nothing written)
-- Touches: lease:{s} (read), sess:{s}.

if not owns(ARGV[2], ARGV[1]) then return 0 end
redis.call('HSET', sess_key(ARGV[2]), unpack(ARGV, 3))
return 1
