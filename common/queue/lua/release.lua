-- release.lua: fenced release of a session's lease; re-notifies `ready` when work remains.
--
-- KEYS[1] lease:{sess}   KEYS[2] ready   KEYS[3] active   KEYS[4] delayed
-- ARGV[1] lease value   ARGV[2] session
-- Returns 1 released | 0 lost (nothing written)
-- Also touches: sq:{sess} (read), sess:{sess} (nid).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
release(ARGV[2], KEYS[1], KEYS[3], KEYS[2], KEYS[4])
return 1
