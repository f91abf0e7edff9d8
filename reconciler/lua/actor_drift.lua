-- actor_drift.lua: record a drift of an actor that has no session (an orphan) in `events`.
--
--! keys: reconciler_leader events
-- ARGV[1] leader value   ARGV[2] atespace   ARGV[3] actor   ARGV[4] drift kind   ARGV[5] detail
-- ARGV[6] now_ms
-- Returns 1 recorded | 0 not the leader (nothing written).

if redis.call('GET', K_RECONCILER_LEADER) ~= ARGV[1] then return 0 end
redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*', 'actor', ARGV[3],
  'atespace', ARGV[2], 'drift', ARGV[4], 'detail', ARGV[5], 'ts_ms', ARGV[6])
return 1
