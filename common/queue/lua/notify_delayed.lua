-- notify_delayed.lua: sessions whose retry backoff is over are notified again.
--
--! keys: delayed active idle idle_until ready events callbacks
-- ARGV[1] now_ms   ARGV[2] max sessions
-- Returns the number of sessions notified.
-- Touches: delayed; per session (computed: read from delayed): lease:{s} (read), sq:{s} (read),
-- sess:{s} (nid), ready or an idle worker (see notify).

local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, session in ipairs(due) do
  redis.call('ZREM', K_DELAYED, session)
  local S = session_keys(session)
  if redis.call('EXISTS', S.lease) == 0 and redis.call('LLEN', S.fifo) > 0 then
    n = n + notify(S, ARGV[1])
  end
end
return n
