-- replay_dlq.lua: put a dead-lettered job back at the tail of its session's FIFO (same job id, so
-- its caller's poll, stream and webhook follow it, and the guest journal still sees one job),
-- attempts reset, its failure, timings and old output cleared; the DLQ entry is dropped.
--
--! keys: dlq work events callbacks active delayed idle idle_until ready
-- ARGV[1] DLQ entry id   ARGV[2] now_ms
-- Returns {'queued', jid} | {'missing'} (no such entry) | {'expired', jid} (the job record is
-- gone; the entry is dropped) | {'not_failed', jid, state} (nothing written)
-- Touches: dlq, work, events; job:{jid}, out:{jid}, sq:{s}, sess:{s} (computed: the job and its
-- session read from the entry); a session with no lease is handed to an idle worker (lease,
-- inbox) or added to `ready` (see notify).

local entry_id, now = ARGV[1], ARGV[2]
local found = redis.call('XRANGE', K_DLQ, entry_id, entry_id)
if #found == 0 then return {'missing'} end
local fields = found[1][2]
local jid, session
for i = 1, #fields, 2 do
  if fields[i] == 'job' then jid = fields[i + 1] elseif fields[i] == 'session' then session = fields[i + 1] end
end
local jk = job_key(jid)
local st = redis.call('HGET', jk, 'st')
if not st then
  redis.call('XDEL', K_DLQ, entry_id)
  return {'expired', jid}
end
if st ~= 'failed' then return {'not_failed', jid, st} end
redis.call('HDEL', jk, 'err', 'res', 'fa', 'sa', 'ep', 'lr', 'cx', 'ow', 'o', 'tr')
redis.call('HSET', jk, 'st', 'queued', 'at', 0, 'rp', now)
redis.call('PERSIST', jk)
redis.call('DEL', out_key(jid))
local S = session_keys(session)
redis.call('RPUSH', S.fifo, jid)
redis.call('ZADD', K_WORK, 'NX', now, session)
redis.call('XDEL', K_DLQ, entry_id)
emit(jid, session, 'queued', now, redis.call('HGET', jk, 'cb'))
if redis.call('EXISTS', S.lease) == 0 then notify(S, now) end
return {'queued', jid}
