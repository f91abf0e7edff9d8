-- notify_orphans.lua: sessions with queued work but no owner, no backoff and no live
-- notification (its `ready` entry vanished) are notified. Also drops stale `work` members.
--
--! keys: work delayed ready active idle idle_until events callbacks
-- ARGV[1] start index into `work`   ARGV[2] max sessions   ARGV[3] now_ms
-- Returns {notified, looked_at}
-- Touches: work; per session (computed: read from work): sq:{s}, lease:{s}, delayed (reads),
-- sess:{s} (nid), ready or an idle worker (see notify).

local start = tonumber(ARGV[1])
local members = redis.call('ZRANGE', K_WORK, start, start + tonumber(ARGV[2]) - 1)
local n = 0
for _, session in ipairs(members) do
  local S = session_keys(session)
  if redis.call('LLEN', S.fifo) == 0 then
    redis.call('ZREM', K_WORK, session)
  elseif redis.call('EXISTS', S.lease) == 0 and not redis.call('ZSCORE', K_DELAYED, session) then
    local nid = redis.call('HGET', S.sess, 'nid')
    if not nid or #redis.call('XRANGE', K_READY, nid, nid) == 0 then
      redis.call('HDEL', S.sess, 'nid')
      n = n + notify(S, ARGV[3])
    end
  end
end
return {n, #members}
