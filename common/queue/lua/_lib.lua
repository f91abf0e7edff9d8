-- _lib.lua: shared helpers, prepended (after the generated key prelude and constants) to every
-- script by common/queue/scripts.py. Not a script by itself.
--
-- Constants from the prelude: EVENTS_MAXLEN, DLQ_MAXLEN, GROUP.
-- Key builders from the prelude: job_key, out_key, sec_key, fifo_key, sess_key, lease_key.

local TERMINAL = {succeeded = true, failed = true, cancelled = true}

-- One entry per job state change; `cb` tells the webhook deliverer to look at the job.
local function emit(events, jid, session, state, now, has_cb)
  if has_cb then
    redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state, 'ts_ms', now, 'cb', '1')
  else
    redis.call('XADD', events, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state, 'ts_ms', now)
  end
end

-- Add a `ready` entry for the session unless one is outstanding (`nid`) or it is backing off.
local function notify(session, ready, delayed)
  local sk = sess_key(session)
  if redis.call('HEXISTS', sk, 'nid') == 1 then return 0 end
  if redis.call('ZSCORE', delayed, session) then return 0 end
  local id = redis.call('XADD', ready, '*', 's', session)
  redis.call('HSET', sk, 'nid', id)
  return 1
end

-- Drop the lease; re-notify when work remains so another turn (any worker) picks it up.
local function release(session, lease, active, ready, delayed)
  redis.call('DEL', lease)
  redis.call('ZREM', active, session)
  if redis.call('LLEN', fifo_key(session)) > 0 then notify(session, ready, delayed) end
end

-- Mark the head job running under `epoch` and return {jid, field, value, ...}, or false when the
-- FIFO is empty. A head job already running was interrupted (lease lost): it keeps its state and
-- start time and is handed out again under the new epoch. Ghost ids (no record) are dropped.
local function take_head(session, epoch, now, events)
  local fifo = fifo_key(session)
  while true do
    local jid = redis.call('LINDEX', fifo, 0)
    if not jid then return false end
    local jk = job_key(jid)
    local st = redis.call('HGET', jk, 'st')
    if st == 'queued' then
      redis.call('HSET', jk, 'st', 'running', 'ep', epoch, 'sa', now)
      emit(events, jid, session, 'running', now, redis.call('HEXISTS', jk, 'cb') == 1)
    elseif st == 'running' then
      redis.call('HSET', jk, 'ep', epoch)
    end
    if st == 'queued' or st == 'running' then
      local out = redis.call('HGETALL', jk)
      table.insert(out, 1, jid)
      return out
    end
    redis.call('LPOP', fifo)
  end
end

-- Terminal transition: out of the FIFO, record state + result/error, TTLs, end marker, secrets
-- gone, event, and the waiters' channel. `field` is 'res' or 'err' (or false for none).
local function finish(jid, session, state, field, value, now, a)
  local jk = job_key(jid)
  local fifo = fifo_key(session)
  redis.call('LREM', fifo, 1, jid)
  if field then
    redis.call('HSET', jk, 'st', state, 'fa', now, field, value)
  else
    redis.call('HSET', jk, 'st', state, 'fa', now)
  end
  redis.call('PEXPIRE', jk, a.ttl_ms)
  redis.call('DEL', sec_key(jid))
  local ok = out_key(jid)
  -- Jobs without output get a short-lived stream holding only the end marker: it wakes blocked
  -- readers; later readers see the terminal record instead.
  local had_output = redis.call('EXISTS', ok) == 1
  redis.call('XADD', ok, 'MAXLEN', '~', a.maxlen, '*', 'event', 'end')
  if had_output then
    redis.call('PEXPIRE', ok, a.ttl_ms)
  else
    redis.call('PEXPIRE', ok, a.end_ttl_ms)
  end
  emit(a.events, jid, session, state, now, redis.call('HEXISTS', jk, 'cb') == 1)
  redis.call('PUBLISH', a.done_channel, jid .. ' ' .. state)
  if redis.call('LLEN', fifo) == 0 then redis.call('ZREM', a.work, session) end
end
