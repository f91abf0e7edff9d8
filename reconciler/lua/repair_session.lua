-- repair_session.lua: the reconciler's write to a session nobody owns, fenced three ways, and
-- its record: drift fields on the session and one entry in `events`.
--
-- KEYS[1] reconciler leader key   KEYS[2] lease:{s}   KEYS[3] sess:{s}   KEYS[4] events
-- ARGV[1] leader value (this instance's)   ARGV[2] epoch seen by the survey ('' = none)
-- ARGV[3] state seen by the survey ('' = none)   ARGV[4] session "env/sid"   ARGV[5] drift kind
-- ARGV[6] detail   ARGV[7] now_ms   ARGV[8] now (unix s)   then field, value pairs to set
-- Returns 'ok' | 'notleader' (a newer leader exists) | 'owned' (a worker holds the lease)
--      | 'changed' (epoch or state moved since the survey: a worker acted; decide again later)
-- Nothing is written unless 'ok'.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'notleader' end
if redis.call('EXISTS', KEYS[2]) == 1 then return 'owned' end
local f = redis.call('HMGET', KEYS[3], 'epoch', 'state')
if (f[1] or '') ~= ARGV[2] or (f[2] or '') ~= ARGV[3] then return 'changed' end
if #ARGV > 8 then redis.call('HSET', KEYS[3], unpack(ARGV, 9)) end
redis.call('HSET', KEYS[3], 'drift', ARGV[5], 'drift_detail', ARGV[6], 'drift_at', ARGV[8])
redis.call('HINCRBY', KEYS[3], 'drifts', 1)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', EVENTS_MAXLEN, '*',
  'session', ARGV[4], 'drift', ARGV[5], 'detail', ARGV[6], 'ts_ms', ARGV[7])
return 'ok'
