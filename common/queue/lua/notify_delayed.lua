-- notify_delayed.lua: sessions whose retry backoff is over are notified again.
--
-- KEYS[1] delayed   KEYS[2] ready
-- ARGV[1] now_ms   ARGV[2] max sessions
-- Returns the number of sessions notified.
-- Also touches, per session: lease:{s} (read), sq:{s} (read), sess:{s} (nid).

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, session in ipairs(due) do
  redis.call('ZREM', KEYS[1], session)
  if redis.call('EXISTS', lease_key(session)) == 0 and redis.call('LLEN', fifo_key(session)) > 0 then
    n = n + notify(session, KEYS[2], KEYS[1])
  end
end
return n
