-- take_work.lua: a worker with free slots takes sessions waiting in `ready` (lease and head job
-- each), then announces the slots it could not fill, so that sessions becoming ready later are
-- handed to it directly (see notify in _lib.lua). Atomic, so a session is never left in `ready`
-- while a live worker has a free slot announced.
--
--! keys: ready delayed active idle idle_until events callbacks
-- ARGV[1] worker id   ARGV[2] slots newly free (not announced yet)   ARGV[3] now_ms
-- ARGV[4] how long the announcement lasts, ms (0: take only, announce nothing)
-- ARGV[5] the worker's free slots in all (announced or not)
-- Returns {handoff json, ...}, each as notify pushes it. When the worker had no live announcement
-- (its first call, or a lapsed one that may have been forgotten), ARGV[5] counts, not ARGV[2].
-- Touches: ready, active, delayed, events, idle, idle_until; sess:{s} (nid, epoch), lease:{s},
-- sq:{s}, job:{head} (computed: sessions read from ready, their head jobs from their FIFOs).

local worker, want, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local announce_ms = tonumber(ARGV[4])
if announce_ms > 0 and tonumber(redis.call('HGET', K_IDLE_UNTIL, worker) or 0) < now then
  -- First announcement, or a lapsed one that may have been forgotten: start from the truth.
  forget_worker(worker)
  want = tonumber(ARGV[5])
end
local out = {}
while #out < want do
  local entries = redis.call('XRANGE', K_READY, '-', '+', 'COUNT', want - #out)
  if #entries == 0 then break end
  for _, entry in ipairs(entries) do
    local id, session = entry[1], entry[2][2]
    redis.call('XDEL', K_READY, id)
    local S = session_keys(session)
    if redis.call('HGET', S.sess, 'nid') == id then redis.call('HDEL', S.sess, 'nid') end
    local due = redis.call('ZSCORE', K_DELAYED, session)
    if due and tonumber(due) <= now then
      redis.call('ZREM', K_DELAYED, session)
      due = false
    end
    -- Owned (its owner re-notifies on release) or backing off (`delayed` re-notifies): skipped.
    if not due and redis.call('EXISTS', S.lease) == 0 then
      local handoff = take_session(S, worker, now)
      if handoff then table.insert(out, cjson.encode(handoff)) end
    end
  end
end
if announce_ms > 0 then
  redis.call('HSET', K_IDLE_UNTIL, worker, now + announce_ms)
  local spare = want - #out
  if spare > 0 then redis.call('ZINCRBY', K_IDLE, spare, worker) end
end
return out
