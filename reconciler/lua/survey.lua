-- survey.lua: one page of an environment's sessions with what every pass decides on.
--
--! keys of (env): index(env)
-- ARGV[1] session name prefix "env/" (session_name(env, ""))   ARGV[2] exclusive lex cursor
--         ('' = from the start)   ARGV[3] page size
-- Returns a flat list, 8 values per session:
--   sid, state, last_activity, epoch, snapshot_kept, queued jobs (LLEN), leased (0/1), exists (0/1)
-- Touches (reads only): sessions:{env}; per session (computed: ids read from the index): sess:{s},
-- sq:{s}, lease:{s}.

local low = '-'
if ARGV[2] ~= '' then low = '(' .. ARGV[2] end
local sids = redis.call('ZRANGEBYLEX', K_INDEX, low, '+', 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, sid in ipairs(sids) do
  local session = ARGV[1] .. sid
  local sk = sess_key(session)
  local f = redis.call('HMGET', sk, 'state', 'last_activity', 'epoch', 'snapshot_kept')
  out[#out + 1] = sid
  out[#out + 1] = f[1] or ''
  out[#out + 1] = f[2] or ''
  out[#out + 1] = f[3] or ''
  out[#out + 1] = f[4] or ''
  out[#out + 1] = redis.call('LLEN', fifo_key(session))
  out[#out + 1] = redis.call('EXISTS', lease_key(session))
  out[#out + 1] = redis.call('EXISTS', sk)
end
return out
