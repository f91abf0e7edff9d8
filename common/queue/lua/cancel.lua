-- cancel.lua: cancel a job. Queued: out of its FIFO, state cancelled. Running: flag `cx` and
-- tell the owning worker on the cancel channel (it stops the execution and finishes the job).
--
-- ARGV[1] jid   ARGV[2] now_ms   ARGV[3] problem JSON
-- Returns 'missing' | 'cancelled' | 'requested' | 'terminal'
-- Touches: job:{jid}; queued: sq:{s}, out:{jid}, sec:{jid}, events, CH_DONE, work;
-- running: CH_CANCEL.

local jid = ARGV[1]
local jk = job_key(jid)
local st = redis.call('HGET', jk, 'st')
if not st then return 'missing' end
if TERMINAL[st] then return 'terminal' end
if st == 'running' then
  redis.call('HSET', jk, 'cx', '1')
  redis.call('PUBLISH', CH_CANCEL, jid)
  return 'requested'
end
finish(jid, redis.call('HGET', jk, 's'), 'cancelled', 'err', ARGV[3], ARGV[2])
return 'cancelled'
