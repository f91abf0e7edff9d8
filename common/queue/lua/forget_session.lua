-- forget_session.lua: delete an idle session's queue state (after it was destroyed, by GC).
-- Refused while the session has an owner or queued work.
--
--! keys: delayed work
--! keys of (s, env): lease(s) fifo(s) sess(s) index(env)
-- ARGV[1] session "env/sid"   ARGV[2] session id
-- Returns 1 forgotten | 0 refused (owned or work queued)
-- Touches: lease:{s}, sq:{s} (reads), sess:{s}, sessions:{env}, delayed, work; owned:{owner}
-- (computed: the owner read from the session hash).

local session = ARGV[1]
if redis.call('EXISTS', K_LEASE) == 1 then return 0 end
if redis.call('LLEN', K_FIFO) > 0 then return 0 end
local owner = redis.call('HGET', K_SESS, 'own')
if owner then redis.call('SREM', owned_key(owner), session) end
redis.call('DEL', K_SESS)
redis.call('ZREM', K_INDEX, ARGV[2])
redis.call('ZREM', K_DELAYED, session)
redis.call('ZREM', K_WORK, session)
return 1
