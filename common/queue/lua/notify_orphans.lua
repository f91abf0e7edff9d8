-- notify_orphans.lua: sessions with queued work but no owner, no backoff and no live
-- notification (its `ready` entry vanished) are notified. Also drops stale `work` members.
--
-- ARGV[1] start index into `work`   ARGV[2] max sessions   ARGV[3] now_ms
-- Returns {notified, looked_at}
-- Touches: work; per session: sq:{s}, lease:{s}, delayed (reads), sess:{s} (nid), ready or an idle worker (see notify).

local start = tonumber(ARGV[1])
local members = redis.call('ZRANGE', K_WORK, start, start + tonumber(ARGV[2]) - 1)
local n = 0
for _, session in ipairs(members) do
  if redis.call('LLEN', fifo_key(session)) == 0 then
    redis.call('ZREM', K_WORK, session)
  elseif redis.call('EXISTS', lease_key(session)) == 0 and not redis.call('ZSCORE', K_DELAYED, session) then
    local sk = sess_key(session)
    local nid = redis.call('HGET', sk, 'nid')
    if not nid or #redis.call('XRANGE', K_READY, nid, nid) == 0 then
      redis.call('HDEL', sk, 'nid')
      n = n + notify(session, ARGV[3])
    end
  end
end
return {n, #members}
