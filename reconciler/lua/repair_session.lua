-- repair_session.lua: the reconciler's write to a session nobody owns, fenced three ways, and
-- its record: drift fields on the session and one entry in `events`.
--
--! keys: reconciler_leader events
--! keys of (s): lease(s) sess(s)
-- ARGV[1] leader value (this instance's)   ARGV[2] epoch seen by the survey ('' = none)
-- ARGV[3] state seen by the survey ('' = none)   ARGV[4] session "env/sid"   ARGV[5] drift kind
-- ARGV[6] detail   ARGV[7] now_ms   ARGV[8] now (unix s)   then field, value pairs to set
-- Returns 'ok' | 'notleader' (a newer leader exists) | 'owned' (a worker holds the lease)
--      | 'changed' (epoch or state moved since the survey: a worker acted; decide again later)
-- Nothing is written unless 'ok'.

if redis.call('GET', K_RECONCILER_LEADER) ~= ARGV[1] then return 'notleader' end
if redis.call('EXISTS', K_LEASE) == 1 then return 'owned' end
local f = redis.call('HMGET', K_SESS, 'epoch', 'state')
if (f[1] or '') ~= ARGV[2] or (f[2] or '') ~= ARGV[3] then return 'changed' end
if #ARGV > 8 then redis.call('HSET', K_SESS, unpack(ARGV, 9)) end
redis.call('HSET', K_SESS, 'drift', ARGV[5], 'drift_detail', ARGV[6], 'drift_at', ARGV[8])
redis.call('HINCRBY', K_SESS, 'drifts', 1)
redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
  'session', ARGV[4], 'drift', ARGV[5], 'detail', ARGV[6], 'ts_ms', ARGV[7])
return 'ok'
