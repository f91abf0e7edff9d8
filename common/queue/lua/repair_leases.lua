-- repair_leases.lua: sessions whose lease expired (owner crashed or stalled) get a new epoch and,
-- when work remains, a notification; their running head job is resumed by the next owner.
--
--! keys: active delayed idle idle_until ready events callbacks
-- ARGV[1] now_ms   ARGV[2] max sessions to look at
-- Returns the number of sessions repaired.
-- Touches: active; per session found (computed: read from active): lease:{s} (read),
-- sess:{s} (epoch, nid), sq:{s} (read), delayed (read), ready or an idle worker (see notify).

local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', K_ACTIVE, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local repaired = 0
for _, session in ipairs(due) do
  local S = session_keys(session)
  local pttl = redis.call('PTTL', S.lease)
  if pttl < 0 then
    redis.call('ZREM', K_ACTIVE, session)
    redis.call('HINCRBY', S.sess, 'epoch', 1)
    if redis.call('LLEN', S.fifo) > 0 then notify(S, now) end
    repaired = repaired + 1
  else
    -- Renewed by a clock running behind ours: index it at its real expiry.
    redis.call('ZADD', K_ACTIVE, now + pttl, session)
  end
end
return repaired
