-- cancel.lua: cancel a job. Queued: out of its FIFO, state cancelled. Running: flag `cx` and
-- tell the owning worker on the cancel channel (it stops the execution and finishes the job).
--
-- KEYS[1] job:{jid}   KEYS[2] events   KEYS[3] work
-- ARGV[1] jid   ARGV[2] now_ms   ARGV[3] terminal ttl ms   ARGV[4] end-marker-only ttl ms
-- ARGV[5] output maxlen   ARGV[6] done channel   ARGV[7] cancel channel   ARGV[8] problem JSON
-- Returns 'missing' | 'cancelled' | 'requested' | 'terminal'
-- Also touches: sq:{sess}, out:{jid}, sec:{jid}.

local st = redis.call('HGET', KEYS[1], 'st')
if not st then return 'missing' end
if TERMINAL[st] then return 'terminal' end
local jid = ARGV[1]
if st == 'running' then
  redis.call('HSET', KEYS[1], 'cx', '1')
  redis.call('PUBLISH', ARGV[7], jid)
  return 'requested'
end
local a = {ttl_ms = ARGV[3], end_ttl_ms = ARGV[4], maxlen = ARGV[5], events = KEYS[2],
  done_channel = ARGV[6], work = KEYS[3]}
finish(jid, redis.call('HGET', KEYS[1], 's'), 'cancelled', 'err', ARGV[8], ARGV[2], a)
return 'cancelled'
