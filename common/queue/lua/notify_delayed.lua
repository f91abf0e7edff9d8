-- notify_delayed.lua: sessions whose retry backoff is over are notified again.
--
-- ARGV[1] now_ms   ARGV[2] max sessions
-- Returns the number of sessions notified.
-- Touches: delayed; per session: lease:{s} (read), sq:{s} (read), sess:{s} (nid), ready or an idle worker (see notify).

local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, session in ipairs(due) do
  redis.call('ZREM', K_DELAYED, session)
  if redis.call('EXISTS', lease_key(session)) == 0 and redis.call('LLEN', fifo_key(session)) > 0 then
    n = n + notify(session, ARGV[1])
  end
end
return n
