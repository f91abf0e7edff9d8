-- renotify.lua: replace stale `ready` entries (claimed with XAUTOCLAIM from consumers that read
-- them and never acted) by fresh ones that any live worker will read.
--
-- KEYS[1] ready   KEYS[2] delayed
-- ARGV pairs: entry id, session
-- Returns the number of sessions notified again.
-- Also touches, per session: sess:{s} (nid), lease:{s} (read), sq:{s} (read).

local n = 0
for i = 1, #ARGV, 2 do
  local id, session = ARGV[i], ARGV[i + 1]
  redis.call('XACK', KEYS[1], GROUP, id)
  redis.call('XDEL', KEYS[1], id)
  local sk = sess_key(session)
  if redis.call('HGET', sk, 'nid') == id then redis.call('HDEL', sk, 'nid') end
  if redis.call('EXISTS', lease_key(session)) == 0 and redis.call('LLEN', fifo_key(session)) > 0 then
    n = n + notify(session, KEYS[1], KEYS[2])
  end
end
return n
