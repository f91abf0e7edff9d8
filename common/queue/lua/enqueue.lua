-- enqueue.lua: record N jobs atomically, each appended to its session's FIFO.
--
-- KEYS[1] ready   KEYS[2] events   KEYS[3] work   KEYS[4] delayed
-- then 5 keys per job i (base = 4 + 5*(i-1)):
--   +1 job:{jid}   +2 sq:{sess}   +3 sess:{sess}   +4 idem key (or the job key when none)
--   +5 sessions:{env}
-- ARGV[1] now_ms   ARGV[2] idempotency ttl ms   ARGV[3] N
-- then 11 values per job i (base = 3 + 11*(i-1)):
--   +1 jid  +2 session "env/sid"  +3 sid  +4 kind  +5 payload json  +6 principal
--   +7 callback_url or ""  +8 callback_secret_id or ""  +9 has idem "1"/""  +10 fingerprint
--   +11 secrets json or ""
-- Returns {'ok', jid1, created1, jid2, created2, ...}  (created = 1 new, 0 idempotent replay)
--      or {'conflict', i, existing_jid}  (nothing written)
-- Also touches: sec:{jid} (when secrets given).
-- Notifies `ready` for a session with no lease, no outstanding notification and no backoff.

local n = tonumber(ARGV[3])
local now = ARGV[1]

-- Phase 1: resolve idempotency keys before writing anything, so a conflict aborts the batch.
local replay = {}
local seen = {}
for i = 1, n do
  local kb, ab = 4 + 5 * (i - 1), 3 + 11 * (i - 1)
  if ARGV[ab + 9] == '1' then
    local ik = KEYS[kb + 4]
    local prior = seen[ik]
    if not prior then
      local v = redis.call('GET', ik)
      if v then
        local sp = string.find(v, ' ', 1, true)
        prior = {string.sub(v, 1, sp - 1), string.sub(v, sp + 1)}
      end
    end
    if prior then
      if prior[2] ~= ARGV[ab + 10] then return {'conflict', i, prior[1]} end
      replay[i] = prior[1]
    else
      seen[ik] = {ARGV[ab + 1], ARGV[ab + 10]}
    end
  end
end

-- Phase 2: write the new jobs in list order (per-session order = list order).
local out = {'ok'}
for i = 1, n do
  local kb, ab = 4 + 5 * (i - 1), 3 + 11 * (i - 1)
  if replay[i] then
    table.insert(out, replay[i]); table.insert(out, 0)
  else
    local jid, session = ARGV[ab + 1], ARGV[ab + 2]
    local jk, fifo, sk = KEYS[kb + 1], KEYS[kb + 2], KEYS[kb + 3]
    redis.call('HSET', jk, 's', session, 'k', ARGV[ab + 4], 'st', 'queued', 'pl', ARGV[ab + 5],
      'pr', ARGV[ab + 6], 'ct', now)
    if ARGV[ab + 7] ~= '' then redis.call('HSET', jk, 'cb', ARGV[ab + 7]) end
    if ARGV[ab + 8] ~= '' then redis.call('HSET', jk, 'cbs', ARGV[ab + 8]) end
    if ARGV[ab + 11] ~= '' then redis.call('SET', sec_key(jid), ARGV[ab + 11]) end
    if ARGV[ab + 9] == '1' then
      redis.call('SET', KEYS[kb + 4], jid .. ' ' .. ARGV[ab + 10], 'PX', ARGV[2])
    end
    redis.call('RPUSH', fifo, jid)
    if redis.call('HSETNX', sk, 'state', 'new') == 1 then
      redis.call('ZADD', KEYS[kb + 5], 'NX', 0, ARGV[ab + 3])
    end
    redis.call('ZADD', KEYS[3], 'NX', now, session)
    emit(KEYS[2], jid, session, 'queued', now, ARGV[ab + 7] ~= '')
    if redis.call('EXISTS', lease_key(session)) == 0 then notify(session, KEYS[1], KEYS[4]) end
    table.insert(out, jid); table.insert(out, 1)
  end
end
return out
