-- enqueue.lua: record N jobs atomically, each appended to its session's FIFO.
--
--! keys: work events callbacks audit active delayed idle idle_until ready
--! keys each (j, s, env, pr, idem): job(j) sec(j) lease(s) fifo(s) sess(s) index(env) idem(idem) owned(pr) pjobs(pr) obytes(pr)
-- ARGV[1] now_ms   ARGV[2] N
-- ARGV[3..7] the principal's quotas (0 = none): sessions owned, jobs queued per session, jobs
--   queued in total, output bytes stored; then the audit stream's MAXLEN (0 = no audit records)
-- then 13 values per job i (base = 7 + 13*(i-1)):
--   +1 jid  +2 session "env/sid"  +3 environment  +4 sid  +5 kind  +6 payload json  +7 principal
--   +8 callback_url or ""  +9 callback_secret_id or ""  +10 idempotency key or ""
--   +11 fingerprint  +12 tenancy: "" (a fleet-internal job: no checks, no owner), "own" (the
--   session must be the principal's or nobody's), "admin" or "shared" (any session; an admin's
--   job in another principal's session is audited as `admin`)
--   +13 what the audit record names (tool or lifecycle op)
-- then N values, one per job: its secrets json or "" (ARGV[7 + 13*N + i]).
-- Returns {'ok', jid1, created1, jid2, created2, ...}  (created = 1 new, 0 idempotent replay)
--      or {'conflict', i, existing_jid}  (nothing written)
--      or {'denied', i}  (job i's session belongs to another principal; nothing written)
--      or {'quota', i, name, retry_after_ms}  (job i would exceed quota `name`; 0 = only the
--         principal's own action frees it; nothing written)
-- Touches: job:{jid}, sec:{jid}, sq:{sess}, sess:{sess}, idem:{principal}:{key} (a job without
-- an idempotency key declares one it never touches), sessions:{env}, work, events,
-- owned:{principal}, pjobs:{principal}, obytes:{principal} (read), audit; the records of the
-- principal's jobs (computed: ids read from pjobs, near the jobs quota); a session with no lease,
-- no outstanding notification and no backoff is handed to an idle worker (lease, inbox) or added
-- to `ready` (see notify in _lib.lua).

local n = tonumber(ARGV[2])
local now = ARGV[1]
local max_owned, max_session_jobs = tonumber(ARGV[3]), tonumber(ARGV[4])
local max_jobs, max_output = tonumber(ARGV[5]), tonumber(ARGV[6])
local audit_maxlen = tonumber(ARGV[7])
local W = 13
local sec_base = 7 + W * n
-- Ended jobs looked for (oldest first) when a principal reaches its jobs quota: bounds the cost.
local PRUNE_MAX = 100
local K = {}
for i = 1, n do K[i] = each_keys(i) end

-- Phase 1: resolve idempotency keys before writing anything, so a conflict aborts the batch.
local replay = {}
local seen = {}
for i = 1, n do
  local b = 7 + W * (i - 1)
  if ARGV[b + 10] ~= '' then
    local ik = K[i].idem
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

-- Jobs in a principal's pjobs `key` not ended yet, after forgetting up to PRUNE_MAX ended ones
-- (oldest first).
local function jobs_in_flight(key)
  for _, jid in ipairs(redis.call('ZRANGE', key, 0, PRUNE_MAX - 1)) do
    local st = redis.call('HGET', job_key(jid), 'st')
    if not st or TERMINAL[st] then redis.call('ZREM', key, jid) end
  end
  return redis.call('ZCARD', key)
end

-- Phase 2: tenancy (owner and quotas) of the new jobs, before writing anything, so a refusal
-- refuses the whole batch. `claims` = sessions this batch will give their first owner.
local claims, others = {}, {}
local claimed, added, fresh = 0, {}, 0
for i = 1, n do
  local b = 7 + W * (i - 1)
  local tenancy = ARGV[b + 12]
  if not replay[i] and tenancy ~= '' then
    local session, principal = ARGV[b + 2], ARGV[b + 7]
    if not claims[session] then
      local owner = redis.call('HGET', K[i].sess, 'own')
      if owner and owner ~= principal then
        if tenancy == 'own' then return {'denied', i} end
        others[session] = true
      end
      if not owner then
        claims[session] = principal
        claimed = claimed + 1
        if max_owned > 0 and redis.call('SCARD', K[i].owned) + claimed > max_owned then
          return {'quota', i, 'sessions_owned', 0}
        end
      end
    end
    added[session] = (added[session] or 0) + 1
    if max_session_jobs > 0 and redis.call('LLEN', K[i].fifo) + added[session] > max_session_jobs then
      return {'quota', i, 'jobs_queued_per_session', 1000}
    end
    fresh = fresh + 1
    if max_jobs > 0 and fresh == 1 and redis.call('ZCARD', K[i].pjobs) + n > max_jobs then
      if jobs_in_flight(K[i].pjobs) + n > max_jobs then return {'quota', i, 'jobs_queued', 1000} end
    end
    if max_output > 0 and fresh == 1 then
      local used = tonumber(redis.call('GET', K[i].obytes) or '0')
      if used >= max_output then
        return {'quota', i, 'output_bytes', math.max(1000, redis.call('PTTL', K[i].obytes))}
      end
    end
  end
end

-- Phase 3: write the new jobs in list order (per-session order = list order).
local out = {'ok'}
for i = 1, n do
  local b = 7 + W * (i - 1)
  if replay[i] then
    table.insert(out, replay[i]); table.insert(out, 0)
  else
    local jid, session, k = ARGV[b + 1], ARGV[b + 2], K[i]
    local jk = k.job
    redis.call('HSET', jk, 's', session, 'k', ARGV[b + 5], 'st', 'queued', 'pl', ARGV[b + 6],
      'pr', ARGV[b + 7], 'ct', now)
    if ARGV[b + 8] ~= '' then redis.call('HSET', jk, 'cb', ARGV[b + 8]) end
    if ARGV[b + 9] ~= '' then redis.call('HSET', jk, 'cbs', ARGV[b + 9]) end
    if ARGV[sec_base + i] ~= '' then redis.call('SET', k.sec, ARGV[sec_base + i], 'PX', TTL_MS) end
    if ARGV[b + 10] ~= '' then
      redis.call('SET', k.idem, jid .. ' ' .. ARGV[b + 11], 'PX', IDEM_TTL_MS)
    end
    redis.call('RPUSH', k.fifo, jid)
    if redis.call('HSETNX', k.sess, 'state', 'new') == 1 then
      redis.call('ZADD', k.index, 'NX', 0, ARGV[b + 4])
    end
    redis.call('ZADD', K_WORK, 'NX', now, session)
    emit(jid, session, 'queued', now, ARGV[b + 8] ~= '')
    if ARGV[b + 12] ~= '' then
      local principal = ARGV[b + 7]
      if claims[session] == principal then
        redis.call('HSET', k.sess, 'own', principal)
        redis.call('SADD', k.owned, session)
        claims[session] = nil
      end
      if max_jobs > 0 then redis.call('ZADD', k.pjobs, now, jid) end
      if audit_maxlen > 0 then
        local ev = (ARGV[b + 12] == 'admin' and others[session]) and 'admin' or 'call'
        redis.call('XADD', K_AUDIT, 'MAXLEN', '~', audit_maxlen, '*', 'ev', ev, 'pr', principal,
          'env', ARGV[b + 3], 'sid', ARGV[b + 4], 'op', ARGV[b + 13], 'job', jid,
          'digest', redis.sha1hex(ARGV[b + 6]))
      end
    end
    if redis.call('EXISTS', k.lease) == 0 then
      notify({id = session, fifo = k.fifo, sess = k.sess, lease = k.lease}, now)
    end
    table.insert(out, jid); table.insert(out, 1)
  end
end
return out
