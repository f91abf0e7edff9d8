-- _lib.lua: shared helpers, prepended to every script by common/queue/scripts.py after the
-- generated prelude. Not a script by itself.
--
-- From the prelude (common/queue/keys.py `Keys.lua_prelude`): K_READY, K_EVENTS, K_CALLBACKS, K_DLQ, K_DELAYED,
-- K_ACTIVE, K_WORK, CH_DONE, CH_CANCEL, GROUP and the builders job_key, out_key, sec_key,
-- fifo_key, sess_key, lease_key, idem_key, index_key.
-- From the config (common/queue/scripts.py): EVENTS_MAXLEN, DLQ_MAXLEN, TTL_MS (terminal jobs),
-- END_TTL_MS (end-marker-only output streams), OUT_MAXLEN, LEASE_TTL_MS, IDEM_TTL_MS,
-- DONE_INLINE_MAX (largest answer carried inline on the done channel).

local TERMINAL = {succeeded = true, failed = true, cancelled = true}

-- One entry per job state change; `cb` marks jobs with a callback. Terminal ones of those also
-- go to `callbacks`, the webhook deliverer's own input.
local function emit(jid, session, state, now, has_cb)
  if has_cb then
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state, 'ts_ms', now, 'cb', '1')
    if TERMINAL[state] then
      redis.call('XADD', K_CALLBACKS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
        'job', jid, 'session', session, 'state', state, 'ts_ms', now, 'cb', '1')
    end
  else
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state, 'ts_ms', now)
  end
end

-- Add a `ready` entry for the session unless one is outstanding (`nid`) or it is backing off.
local function notify(session)
  local sk = sess_key(session)
  if redis.call('HEXISTS', sk, 'nid') == 1 then return 0 end
  if redis.call('ZSCORE', K_DELAYED, session) then return 0 end
  local id = redis.call('XADD', K_READY, '*', 's', session)
  redis.call('HSET', sk, 'nid', id)
  return 1
end

-- Drop the lease; re-notify when work remains so another turn (any worker) picks it up.
local function release(session)
  redis.call('DEL', lease_key(session))
  redis.call('ZREM', K_ACTIVE, session)
  if redis.call('LLEN', fifo_key(session)) > 0 then notify(session) end
end

-- Whether `value` is the session's lease value (the fencing check of every worker write).
local function owns(session, value)
  return redis.call('GET', lease_key(session)) == value
end

-- Mark the head job running under `epoch` and return {jid, field, value, ...}, or false when the
-- FIFO is empty. A head job already running was interrupted (lease lost): it keeps its state and
-- start time and is handed out again under the new epoch. Ghost ids (no record) are dropped.
local function take_head(session, epoch, now)
  local fifo = fifo_key(session)
  while true do
    local jid = redis.call('LINDEX', fifo, 0)
    if not jid then return false end
    local jk = job_key(jid)
    local f = redis.call('HMGET', jk, 'st', 'cb')
    local st = f[1]
    if st == 'queued' then
      redis.call('HSET', jk, 'st', 'running', 'ep', epoch, 'sa', now)
      emit(jid, session, 'running', now, f[2])
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
-- A job already terminal is left alone (a retried call whose first reply was lost): false.
local function finish(jid, session, state, field, value, now)
  local jk = job_key(jid)
  local f = redis.call('HMGET', jk, 'st', 'cb', 'ow')
  if TERMINAL[f[1] or ''] then return false end
  local fifo = fifo_key(session)
  redis.call('LREM', fifo, 1, jid)
  if field then
    redis.call('HSET', jk, 'st', state, 'fa', now, field, value)
  else
    redis.call('HSET', jk, 'st', state, 'fa', now)
  end
  redis.call('PEXPIRE', jk, TTL_MS)
  redis.call('DEL', sec_key(jid))
  local ok = out_key(jid)
  if redis.call('EXISTS', ok) == 1 then
    redis.call('XADD', ok, 'MAXLEN', '~', OUT_MAXLEN, '*', 'event', 'end')
    redis.call('PEXPIRE', ok, TTL_MS)
  elseif f[3] then
    -- No output, but a reader is blocked on the stream (`ow`): wake it with a short-lived end
    -- marker. Later readers see the terminal record instead.
    redis.call('XADD', ok, '*', 'event', 'end')
    redis.call('PEXPIRE', ok, END_TTL_MS)
  end
  emit(jid, session, state, now, f[2])
  -- A finished job is session activity (what idle suspension measures from), in unix seconds.
  redis.call('HSET', sess_key(session), 'last_activity', string.format('%.3f', tonumber(now) / 1000))
  -- The waiters' note carries a small answer inline, so a sync caller needs no read of the record.
  local note = jid .. ' ' .. state
  if field and #value <= DONE_INLINE_MAX then note = note .. ' ' .. field .. ' ' .. value end
  redis.call('PUBLISH', CH_DONE, note)
  if redis.call('LLEN', fifo) == 0 then redis.call('ZREM', K_WORK, session) end
  return true
end
