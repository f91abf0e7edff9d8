-- retry.lua: fenced "retry later" of the running head job. The job stays at the head of its FIFO
-- (state back to queued, attempts + 1) and the session backs off in `delayed`, lease released.
-- At max attempts the job fails with the given problem (attempts added), goes to the DLQ, and
-- the session is released (re-notified when more work remains).
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid   ARGV[4] reason   ARGV[5] now_ms
-- ARGV[6] delay ms   ARGV[7] max attempts   ARGV[8] problem JSON
-- Returns {'retry', attempts} | {'dead', attempts} | {'lost'} (nothing written)
-- Touches: lease:{s}, job:{jid}, events, delayed, active, sq:{s}, sess:{s} (nid), ready or an idle worker (see notify);
-- when dead also out:{jid}, sec:{jid}, CH_DONE, work, dlq.

local session, jid, now = ARGV[2], ARGV[3], ARGV[5]
if not owns(session, ARGV[1]) then return {'lost'} end
local jk = job_key(jid)
local attempts = redis.call('HINCRBY', jk, 'at', 1)
redis.call('HSET', jk, 'lr', ARGV[4])
if attempts >= tonumber(ARGV[7]) then
  local problem = cjson.decode(ARGV[8])
  problem['attempts'] = attempts
  finish(jid, session, 'failed', 'err', cjson.encode(problem), now)
  redis.call('XADD', K_DLQ, 'MAXLEN', '~', DLQ_MAXLEN, '*', 'job', jid, 'session', session,
    'reason', ARGV[4], 'attempts', attempts, 'ts_ms', now)
  release(session, now)
  return {'dead', attempts}
end
redis.call('HSET', jk, 'st', 'queued')
emit(jid, session, 'queued', now, redis.call('HGET', jk, 'cb'))
redis.call('ZADD', K_DELAYED, tonumber(now) + tonumber(ARGV[6]), session)
release(session, now)
return {'retry', attempts}
