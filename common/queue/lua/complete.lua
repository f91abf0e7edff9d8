-- complete.lua: fenced terminal transition of the running head job, then either take the next
-- job (same lease) or release the session: one round trip per job.
--
--! keys: events callbacks work active delayed idle idle_until ready
--! keys of (s, j): lease(s) fifo(s) sess(s) job(j) out(j) sec(j)
-- ARGV[1] lease value "<worker>:<epoch>"   ARGV[2] session   ARGV[3] epoch   ARGV[4] jid
-- ARGV[5] state (succeeded|failed|cancelled)   ARGV[6] 'res' | 'err' | '' (field to store)
-- ARGV[7] its JSON   ARGV[8] now_ms   ARGV[9] '1' take next | '0' release
-- ARGV[10] output the worker still held ('' none)   ARGV[11] what was truncated ('' nothing)
-- ARGV[12] what the record keeps of that output if it is folded ('' the output itself)
-- Returns {'next', jid, field, value, ...} | {'released'} | {'lost'} (nothing written)
-- Touches: lease:{s}, job:{jid}, out:{jid}, sec:{jid}, sq:{s}, events, CH_DONE, work;
-- then job:{next} (computed: read from the FIFO), now running, or the session released (and
-- handed on: see notify in _lib.lua).

local now = ARGV[8]
if not owns(K_LEASE, ARGV[1]) then return {'lost'} end
local S = {id = ARGV[2], fifo = K_FIFO, sess = K_SESS, lease = K_LEASE}
local field = ARGV[6]
if field == '' then field = false end
finish({id = ARGV[4], job = K_JOB, out = K_OUT, sec = K_SEC}, S, ARGV[5], field, ARGV[7], now,
  ARGV[10], ARGV[11], ARGV[12])
if ARGV[9] == '1' then
  local head = take_head(S, ARGV[3], now)
  if head then
    table.insert(head, 1, 'next')
    return head
  end
end
release(S, now)
return {'released'}
