-- cancel.lua: cancel a job. Queued: out of its FIFO, state cancelled. Running: flag `cx` and
-- tell the owning worker on the cancel channel (it stops the execution and finishes the job).
--
--! keys: events callbacks work
--! keys of (j): job(j) out(j) sec(j)
-- ARGV[1] jid   ARGV[2] now_ms   ARGV[3] problem JSON
-- Returns 'missing' | 'cancelled' | 'requested' | 'terminal'
-- Touches: job:{jid}; queued: out:{jid}, sec:{jid}, events, CH_DONE, work, and sq:{s}, sess:{s}
-- (computed: the session read from the job); running: CH_CANCEL.

local jid = ARGV[1]
local st = redis.call('HGET', K_JOB, 'st')
if not st then return 'missing' end
if TERMINAL[st] then return 'terminal' end
if st == 'running' then
  redis.call('HSET', K_JOB, 'cx', '1')
  redis.call('PUBLISH', CH_CANCEL, jid)
  return 'requested'
end
local session = redis.call('HGET', K_JOB, 's')
local S = {id = session, fifo = fifo_key(session), sess = sess_key(session)}
finish({id = jid, job = K_JOB, out = K_OUT, sec = K_SEC}, S, 'cancelled', 'err', ARGV[3], ARGV[2])
return 'cancelled'
