-- complete.lua: fenced terminal transition of the running head job, then either take the next
-- job (same lease, renewed) or release the session — one round trip per job.
--
-- KEYS[1] lease:{sess}   KEYS[2] ready   KEYS[3] events   KEYS[4] active   KEYS[5] work
-- KEYS[6] delayed
-- ARGV[1] lease value "<worker>:<epoch>"   ARGV[2] jid   ARGV[3] state (succeeded|failed|cancelled)
-- ARGV[4] 'res' | 'err' | '' (field to store)   ARGV[5] its JSON   ARGV[6] now_ms
-- ARGV[7] terminal ttl ms   ARGV[8] end-marker-only ttl ms   ARGV[9] output maxlen
-- ARGV[10] session   ARGV[11] '1' take next | '0' release   ARGV[12] lease ttl ms (on take next)
-- ARGV[13] done channel   ARGV[14] epoch
-- Returns {'next', jid, field, value, ...} | {'released'} | {'lost'} (nothing written)
-- Also touches: job:{jid}, out:{jid}, sec:{jid}, sq:{sess}, sess:{sess} (nid), job:{next}.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'lost'} end
local session, now = ARGV[10], ARGV[6]
local a = {ttl_ms = ARGV[7], end_ttl_ms = ARGV[8], maxlen = ARGV[9], events = KEYS[3],
  done_channel = ARGV[13], work = KEYS[5]}
local field = ARGV[4]
if field == '' then field = false end
-- A retried call whose first reply was lost finds the job already terminal: finish it once.
if not TERMINAL[redis.call('HGET', job_key(ARGV[2]), 'st') or ''] then
  finish(ARGV[2], session, ARGV[3], field, ARGV[5], now, a)
end
if ARGV[11] == '1' then
  local head = take_head(session, ARGV[14], now, KEYS[3])
  if head then
    redis.call('PEXPIRE', KEYS[1], ARGV[12])
    redis.call('ZADD', KEYS[4], tonumber(now) + tonumber(ARGV[12]), session)
    table.insert(head, 1, 'next')
    return head
  end
end
release(session, KEYS[1], KEYS[4], KEYS[2], KEYS[6])
return {'released'}
