-- update_session.lua: fenced HSET of worker-maintained fields of the session hash.
--
--! keys of (s): lease(s) sess(s)
-- ARGV[1] lease value   then field, value pairs
-- Returns 1 written | 0 lost (nothing written)
-- Touches: lease:{s} (read), sess:{s}.

if not owns(K_LEASE, ARGV[1]) then return 0 end
redis.call('HSET', K_SESS, unpack(ARGV, 2))
return 1
