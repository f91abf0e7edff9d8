-- notify_orphans.lua: sessions with queued work but no owner, no backoff and no live
-- notification (its `ready` entry vanished) are notified. Also drops stale `work` members.
--
-- KEYS[1] work   KEYS[2] ready   KEYS[3] delayed
-- ARGV[1] start index into `work`   ARGV[2] max sessions
-- Returns {notified, looked_at}
-- Also touches, per session: sq:{s}, lease:{s}, sess:{s} (nid) — reads, nid rewritten.

local start = tonumber(ARGV[1])
local members = redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
local n = 0
for _, session in ipairs(members) do
  if redis.call('LLEN', fifo_key(session)) == 0 then
    redis.call('ZREM', KEYS[1], session)
  elseif redis.call('EXISTS', lease_key(session)) == 0 and not redis.call('ZSCORE', KEYS[3], session) then
    local sk = sess_key(session)
    local nid = redis.call('HGET', sk, 'nid')
    if not nid or #redis.call('XRANGE', KEYS[2], nid, nid) == 0 then
      redis.call('HDEL', sk, 'nid')
      n = n + notify(session, KEYS[2], KEYS[3])
    end
  end
end
return {n, #members}
