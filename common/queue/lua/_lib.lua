-- _lib.lua: shared helpers, prepended to every queue script by common/queue/scripts.py after the
-- declared keys and the builders of computed keys (common/redis/scripts.py). Not a script itself.
--
-- A helper reads the fleet-wide keys a script declares (K_EVENTS, K_ACTIVE, ...): a script
-- declares every one its helpers reach (tests/redis/test_redis_scripts.py checks it). A
-- session's keys travel as a table S = {id = "env/sid", fifo = sq:{s}, sess = sess:{s},
-- lease = lease:{s}}, a job's as J = {id = jid, job = job:{jid}, out = out:{jid},
-- sec = sec:{jid}}: declared by the script for the session or job its caller names, built
-- (`session_keys`) for one it reads.
-- From the config (common/queue/scripts.py): EVENTS_MAXLEN, DLQ_MAXLEN, TTL_MS (terminal jobs),
-- END_TTL_MS (streams written only to wake a blocked reader), OUT_TTL_MS (finished output
-- streams), FOLD_MAX (output folded into the record at most), OUT_MAXLEN, LEASE_TTL_MS,
-- IDEM_TTL_MS, DONE_INLINE_MAX (largest answer carried inline on the done channel).

local TERMINAL = {succeeded = true, failed = true, cancelled = true}

-- One entry per job state change (its id carries the time); `cb` marks jobs with a callback.
-- Terminal ones of those also go to `callbacks`, the webhook deliverer's own input.
local function emit(jid, session, state, now, has_cb)
  if has_cb then
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state, 'cb', '1')
    if TERMINAL[state] then
      redis.call('XADD', K_CALLBACKS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
        'job', jid, 'session', session, 'state', state, 'ts_ms', now, 'cb', '1')
    end
  else
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVENTS_MAXLEN, '*',
      'job', jid, 'session', session, 'state', state)
  end
end

-- Append output chunks (`output`: JSON [stream, data, stream, data, ...]) to a stream.
local function append_chunks(key, output)
  local flat = cjson.decode(output)
  for i = 1, #flat, 2 do
    redis.call('XADD', key, 'MAXLEN', '~', OUT_MAXLEN, '*', 'stream', flat[i], 'data', flat[i + 1])
  end
end

-- Whether `value` is what the lease key `lk` holds (the fencing check of every worker write).
local function owns(lk, value)
  return redis.call('GET', lk) == value
end

-- The keys of a session whose name the script read from data (no caller could declare them).
local function session_keys(s)
  return {id = s, fifo = fifo_key(s), sess = sess_key(s), lease = lease_key(s)}
end

-- Mark the head job of session S running under `epoch` and return {jid, field, value, ...}, or
-- false when the FIFO is empty. A head job already running was interrupted (lease lost): it keeps
-- its state and start time and is handed out again under the new epoch. Ghost ids (no record)
-- are dropped.
local function take_head(S, epoch, now)
  while true do
    local jid = redis.call('LINDEX', S.fifo, 0)
    if not jid then return false end
    local jk = job_key(jid)
    local f = redis.call('HMGET', jk, 'st', 'cb')
    local st = f[1]
    if st == 'queued' then
      redis.call('HSET', jk, 'st', 'running', 'ep', epoch, 'sa', now)
      emit(jid, S.id, 'running', now, f[2])
    elseif st == 'running' then
      redis.call('HSET', jk, 'ep', epoch)
    end
    if st == 'queued' or st == 'running' then
      local out = redis.call('HGETALL', jk)
      table.insert(out, 1, jid)
      return out
    end
    redis.call('LPOP', S.fifo)
  end
end

-- Take session S's lease for `worker` (a new epoch) and its head job, now running. Returns the
-- handoff (session, epoch, jid, field, value, ...) or false when the FIFO held nothing to run.
-- The caller has checked that nobody owns the session and that it is not backing off.
local function take_session(S, worker, now)
  local epoch = redis.call('HINCRBY', S.sess, 'epoch', 1)
  redis.call('SET', S.lease, worker .. ':' .. epoch, 'PX', LEASE_TTL_MS)
  redis.call('ZADD', K_ACTIVE, now + LEASE_TTL_MS, S.id)
  local head = take_head(S, epoch, now)
  if not head then
    redis.call('DEL', S.lease)
    redis.call('ZREM', K_ACTIVE, S.id)
    return false
  end
  table.insert(head, 1, epoch)
  table.insert(head, 1, S.id)
  return head
end

-- A worker that stopped renewing its announcement (dead, or stalled past it) is handed nothing
-- more. What its inbox holds is left to it (a stalled worker still takes it), to its next start
-- or the reconciler (`hand_back`), or to lease expiry.
local function forget_worker(worker)
  redis.call('ZREM', K_IDLE, worker)
  redis.call('HDEL', K_IDLE_UNTIL, worker)
end

-- The live worker with the most free slots announced, or false.
local function idle_worker(now)
  while true do
    local top = redis.call('ZREVRANGE', K_IDLE, 0, 0)
    local worker = top[1]
    if not worker then return false end
    if tonumber(redis.call('HGET', K_IDLE_UNTIL, worker) or 0) >= tonumber(now) then return worker end
    forget_worker(worker)
  end
end

-- Session S has work and no owner: hand it to an idle worker (its lease taken for that worker,
-- the head job pushed to the worker's inbox, which the worker is blocked on), or, when no worker
-- has a free slot, add a `ready` entry, unless one is outstanding (`nid`) or it is backing off.
local function notify(S, now)
  if redis.call('HEXISTS', S.sess, 'nid') == 1 then return 0 end
  if redis.call('ZSCORE', K_DELAYED, S.id) then return 0 end
  local worker = idle_worker(now)
  if worker then
    local handoff = take_session(S, worker, now)
    if not handoff then return 0 end
    if tonumber(redis.call('ZINCRBY', K_IDLE, -1, worker)) <= 0 then redis.call('ZREM', K_IDLE, worker) end
    redis.call('RPUSH', inbox_key(worker), cjson.encode(handoff))
    return 1
  end
  local id = redis.call('XADD', K_READY, '*', 's', S.id)
  redis.call('HSET', S.sess, 'nid', id)
  return 1
end

-- Drop session S's lease; re-notify when work remains so another turn (any worker) picks it up.
local function release(S, now)
  redis.call('DEL', S.lease)
  redis.call('ZREM', K_ACTIVE, S.id)
  if redis.call('LLEN', S.fifo) > 0 then notify(S, now) end
end

-- Release the sessions handed to `worker` (its inbox: the key `inbox`) that it has not taken
-- (their leases still its own) and empty the inbox. Returns how many were released.
local function hand_back(inbox, worker, now)
  local n = 0
  for _, raw in ipairs(redis.call('LRANGE', inbox, 0, -1)) do
    if raw ~= '' then
      local handoff = cjson.decode(raw)
      local S = session_keys(handoff[1])
      if owns(S.lease, worker .. ':' .. handoff[2]) then
        release(S, now)
        n = n + 1
      end
    end
  end
  redis.call('DEL', inbox)
  return n
end

-- Terminal transition of job J of session S: out of the FIFO, record state + result/error, TTLs,
-- output, secrets gone, event, and the waiters' channel. `field` is 'res' or 'err' (or false for
-- none); `output` the output the worker still held (JSON, see append_chunks; '' for none) and
-- `truncated` what was cut ('output', 'result', both comma-separated, or ''), `folded` what the
-- record keeps of `output` when it is folded ('' or nil: `output` itself; see common/queue/compact.py).
-- A job already terminal is left alone (a retried call whose first reply was lost): false.
-- The first write is LREM (not refused at maxmemory), so under a full Redis it still runs whole.
local function finish(J, S, state, field, value, now, output, truncated, folded)
  local jid, jk = J.id, J.job
  local f = redis.call('HMGET', jk, 'st', 'cb', 'ow')
  if TERMINAL[f[1] or ''] then return false end
  redis.call('LREM', S.fifo, 1, jid)
  if field then
    redis.call('HSET', jk, 'st', state, 'fa', now, field, value)
  else
    redis.call('HSET', jk, 'st', state, 'fa', now)
  end
  -- Kept for `jobs.ttl_s`: what a client can ask for (state, result, error, timings, owner);
  -- a failed job keeps its payload too, as a dead-lettered one may be replayed (replay_dlq.lua).
  if state == 'failed' then
    redis.call('HDEL', jk, 'ow', 'cx')
  else
    redis.call('HDEL', jk, 'pl', 'ow', 'cx')
  end
  if truncated and truncated ~= '' then redis.call('HSET', jk, 'tr', truncated) end
  redis.call('PEXPIRE', jk, TTL_MS)
  redis.call('DEL', J.sec)
  local ok = J.out
  output = output or ''
  if redis.call('EXISTS', ok) == 1 or #output > FOLD_MAX then
    -- Streamed: its tail, the end marker, and as long as a reader may still stream it.
    if output ~= '' then append_chunks(ok, output) end
    redis.call('XADD', ok, 'MAXLEN', '~', OUT_MAXLEN, '*', 'event', 'end')
    redis.call('PEXPIRE', ok, OUT_TTL_MS)
  else
    -- Small and quick: folded into the record (readers get it from there, see read_output).
    if output ~= '' then
      redis.call('HSET', jk, 'o', (folded and folded ~= '') and folded or output)
    end
    if f[3] then
      -- A reader is blocked on the stream (`ow`): give it the output and an end marker, briefly.
      if output ~= '' then append_chunks(ok, output) end
      redis.call('XADD', ok, '*', 'event', 'end')
      redis.call('PEXPIRE', ok, END_TTL_MS)
    end
  end
  emit(jid, S.id, state, now, f[2])
  -- A finished job is session activity (what idle suspension measures from), in unix seconds.
  redis.call('HSET', S.sess, 'last_activity', string.format('%.3f', tonumber(now) / 1000))
  -- The waiters' note carries a small answer inline, so a sync caller needs no read of the record.
  local note = jid .. ' ' .. state
  if field and #value <= DONE_INLINE_MAX then note = note .. ' ' .. field .. ' ' .. value end
  redis.call('PUBLISH', CH_DONE, note)
  if redis.call('LLEN', S.fifo) == 0 then redis.call('ZREM', K_WORK, S.id) end
  return true
end
