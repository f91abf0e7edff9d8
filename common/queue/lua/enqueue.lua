-- enqueue.lua: record N jobs atomically, each appended to its session's FIFO.
--
-- ARGV[1] now_ms   ARGV[2] N
-- then 11 values per job i (base = 2 + 11*(i-1)):
--   +1 jid  +2 session "env/sid"  +3 environment  +4 sid  +5 kind  +6 payload json  +7 principal
--   +8 callback_url or ""  +9 callback_secret_id or ""  +10 idempotency key or ""
--   +11 fingerprint
-- then N values, one per job: its secrets json or "" (ARGV[2 + 11*N + i]).
-- Returns {'ok', jid1, created1, jid2, created2, ...}  (created = 1 new, 0 idempotent replay)
--      or {'conflict', i, existing_jid}  (nothing written)
-- Touches: job:{jid}, sec:{jid}, sq:{sess}, sess:{sess}, idem:{principal}:{key}, sessions:{env},
-- work, events; a session with no lease, no outstanding notification and no backoff is handed
-- to an idle worker (lease, inbox) or added to `ready` (see notify in _lib.lua).

local n = tonumber(ARGV[2])
local now = ARGV[1]
local sec_base = 2 + 11 * n

-- Phase 1: resolve idempotency keys before writing anything, so a conflict aborts the batch.
local replay = {}
local seen = {}
for i = 1, n do
  local b = 2 + 11 * (i - 1)
  if ARGV[b + 10] ~= '' then
    local ik = idem_key(ARGV[b + 7], ARGV[b + 10])
    local prior = seen[ik]
    if not prior then
      local v = redis.call('GET', ik)
      if v then
        local sp = string.find(v, ' ', 1, true)
        prior = {string.sub(v, 1, sp - 1), string.sub(v, sp + 1)}
      end
    end
    if prior then
      if prior[2] ~= ARGV[b + 11] then return {'conflict', i, prior[1]} end
      replay[i] = prior[1]
    else
      seen[ik] = {ARGV[b + 1], ARGV[b + 11]}
    end
  end
end

-- Phase 2: write the new jobs in list order (per-session order = list order).
local out = {'ok'}
for i = 1, n do
  local b = 2 + 11 * (i - 1)
  if replay[i] then
    table.insert(out, replay[i]); table.insert(out, 0)
  else
    local jid, session = ARGV[b + 1], ARGV[b + 2]
    local jk = job_key(jid)
    redis.call('HSET', jk, 's', session, 'k', ARGV[b + 5], 'st', 'queued', 'pl', ARGV[b + 6],
      'pr', ARGV[b + 7], 'ct', now)
    if ARGV[b + 8] ~= '' then redis.call('HSET', jk, 'cb', ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then redis.call('HSET', jk, 'cbs', ARGV[b + 9]) end
    if ARGV[sec_base + i] ~= '' then redis.call('SET', sec_key(jid), ARGV[sec_base + i]) end
    if ARGV[b + 10] ~= '' then
      redis.call('SET', idem_key(ARGV[b + 7], ARGV[b + 10]), jid .. ' ' .. ARGV[b + 11], 'PX', IDEM_TTL_MS)
    end
    redis.call('RPUSH', fifo_key(session), jid)
    if redis.call('HSETNX', sess_key(session), 'state', 'new') == 1 then
      redis.call('ZADD', index_key(ARGV[b + 3]), 'NX', 0, ARGV[b + 4])
    end
    redis.call('ZADD', K_WORK, 'NX', now, session)
    emit(jid, session, 'queued', now, ARGV[b + 8] ~= '')
    if redis.call('EXISTS', lease_key(session)) == 0 then notify(session, now) end
    table.insert(out, jid); table.insert(out, 1)
  end
end
return out
