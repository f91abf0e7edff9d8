-- retry.lua: fenced "retry later" of the running head job. The job stays at the head of its FIFO
-- (state back to queued, attempts + 1) and the session backs off in `delayed`, lease released.
-- At max attempts the job fails with the given problem (attempts added), goes to the DLQ, and
-- the session is released (re-notified when more work remains).
--
--! keys: events callbacks work dlq active delayed idle idle_until ready
--! keys of (s, j): lease(s) fifo(s) sess(s) job(j) out(j) sec(j)
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid   ARGV[4] reason   ARGV[5] now_ms
-- ARGV[6] delay ms   ARGV[7] max attempts   ARGV[8] problem JSON
-- Returns {'retry', attempts} | {'dead', attempts} | {'lost'} (nothing written)
-- Touches: lease:{s}, job:{jid}, events, delayed, active, sq:{s}, sess:{s} (nid), ready or an
-- idle worker (see notify); when dead also out:{jid}, sec:{jid}, CH_DONE, work, dlq.

local session, jid, now = ARGV[2], ARGV[3], ARGV[5]
if not owns(K_LEASE, ARGV[1]) then return {'lost'} end
local S = {id = session, fifo = K_FIFO, sess = K_SESS, lease = K_LEASE}
local attempts = redis.call('HINCRBY', K_JOB, 'at', 1)
redis.call('HSET', K_JOB, 'lr', ARGV[4])
if attempts >= tonumber(ARGV[7]) then
  local problem = cjson.decode(ARGV[8])
  problem['attempts'] = attempts
  finish({id = jid, job = K_JOB, out = K_OUT, sec = K_SEC}, S, 'failed', 'err', cjson.encode(problem), now)
  redis.call('XADD', K_DLQ, 'MAXLEN', '~', DLQ_MAXLEN, '*', 'job', jid, 'session', session,
    'reason', ARGV[4], 'attempts', attempts, 'ts_ms', now)
  release(S, now)
  return {'dead', attempts}
end
redis.call('HSET', K_JOB, 'st', 'queued')
emit(jid, session, 'queued', now, redis.call('HGET', K_JOB, 'cb'))
redis.call('ZADD', K_DELAYED, tonumber(now) + tonumber(ARGV[6]), session)
release(S, now)
return {'retry', attempts}
