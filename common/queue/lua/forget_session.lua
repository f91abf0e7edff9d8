-- forget_session.lua: delete an idle session's queue state (after it was destroyed, by GC).
-- Refused while the session has an owner or queued work.
--
-- ARGV[1] session "env/sid"   ARGV[2] environment   ARGV[3] session id
-- Returns 1 forgotten | 0 refused (owned or work queued)
-- Touches: lease:{s}, sq:{s} (reads), sess:{s}, sessions:{env}, delayed, work, owned:{owner}.

local session = ARGV[1]
if redis.call('EXISTS', lease_key(session)) == 1 then return 0 end
if redis.call('LLEN', fifo_key(session)) > 0 then return 0 end
local owner = redis.call('HGET', sess_key(session), 'own')
if owner then redis.call('SREM', owned_key(owner), session) end
redis.call('DEL', sess_key(session))
redis.call('ZREM', index_key(ARGV[2]), ARGV[3])
redis.call('ZREM', K_DELAYED, session)
redis.call('ZREM', K_WORK, session)
return 1
