-- forget_workers.lua: workers whose announcement lapsed (crashed, or stalled past it) are
-- forgotten, and the sessions handed to them but never taken are released (handed on).
--
--! keys: idle idle_until active delayed ready events callbacks
-- ARGV[1] now_ms
-- Returns the number of workers forgotten.
-- Touches: idle, idle_until; inbox:{worker} of each lapsed worker (computed: workers read from
-- idle_until); per handed session (computed: read from the inbox): lease:{s}, active, sq:{s},
-- sess:{s} (nid), ready or an idle worker (see notify).

local now = tonumber(ARGV[1])
local flat = redis.call('HGETALL', K_IDLE_UNTIL)
local n = 0
for i = 1, #flat, 2 do
  if tonumber(flat[i + 1]) < now then
    forget_worker(flat[i])
    hand_back(inbox_key(flat[i]), flat[i], now)
    n = n + 1
  end
end
return n
