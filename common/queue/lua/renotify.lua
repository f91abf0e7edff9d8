-- renotify.lua: replace stale `ready` entries (claimed with XAUTOCLAIM from consumers that read
-- them and never acted) by fresh ones that any live worker will read.
--
-- ARGV pairs: entry id, session
-- Returns the number of sessions notified again.
-- Touches: ready; per session: sess:{s} (nid), lease:{s} (read), sq:{s} (read), delayed (read).

local n = 0
for i = 1, #ARGV, 2 do
  local id, session = ARGV[i], ARGV[i + 1]
  redis.call('XACK', K_READY, GROUP, id)
  redis.call('XDEL', K_READY, id)
  local sk = sess_key(session)
  if redis.call('HGET', sk, 'nid') == id then redis.call('HDEL', sk, 'nid') end
  if redis.call('EXISTS', lease_key(session)) == 0 and redis.call('LLEN', fifo_key(session)) > 0 then
    n = n + notify(session)
  end
end
return n
