-- retry.lua: fenced "retry later" of the running head job. The job stays at the head of its FIFO
-- (state back to queued, attempts + 1) and the session backs off in `delayed`, lease released.
-- At max attempts the job fails with the given problem (attempts added), goes to the DLQ, and
-- the session is released (re-notified when more work remains).
--
-- KEYS[1] lease:{sess}   KEYS[2] ready   KEYS[3] events   KEYS[4] active   KEYS[5] work
-- KEYS[6] delayed   KEYS[7] dlq   KEYS[8] job:{jid}
-- ARGV[1] lease value   ARGV[2] jid   ARGV[3] reason   ARGV[4] now_ms   ARGV[5] delay ms
-- ARGV[6] max attempts   ARGV[7] terminal ttl ms   ARGV[8] end-marker-only ttl ms
-- ARGV[9] output maxlen   ARGV[10] session   ARGV[11] done channel   ARGV[12] problem JSON
-- Returns {'retry', attempts} | {'dead', attempts} | {'lost'} (nothing written)
-- Also touches: sq:{sess}, sess:{sess} (nid), out:{jid}, sec:{jid} (when dead).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'lost'} end
local jid, session, now = ARGV[2], ARGV[10], ARGV[4]
local attempts = redis.call('HINCRBY', KEYS[8], 'at', 1)
redis.call('HSET', KEYS[8], 'lr', ARGV[3])
if attempts >= tonumber(ARGV[6]) then
  local problem = cjson.decode(ARGV[12])
  problem['attempts'] = attempts
  local a = {ttl_ms = ARGV[7], end_ttl_ms = ARGV[8], maxlen = ARGV[9], events = KEYS[3],
    done_channel = ARGV[11], work = KEYS[5]}
  finish(jid, session, 'failed', 'err', cjson.encode(problem), now, a)
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', DLQ_MAXLEN, '*', 'job', jid, 'session', session,
    'reason', ARGV[3], 'attempts', attempts, 'ts_ms', now)
  release(session, KEYS[1], KEYS[4], KEYS[2], KEYS[6])
  return {'dead', attempts}
end
redis.call('HSET', KEYS[8], 'st', 'queued')
emit(KEYS[3], jid, session, 'queued', now, redis.call('HEXISTS', KEYS[8], 'cb') == 1)
redis.call('ZADD', KEYS[6], tonumber(now) + tonumber(ARGV[5]), session)
release(session, KEYS[1], KEYS[4], KEYS[2], KEYS[6])
return {'retry', attempts}
