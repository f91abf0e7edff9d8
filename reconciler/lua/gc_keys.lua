-- gc_keys.lua: repair keys that should expire but would not (found by SCAN): a terminal job
-- record or output stream without TTL, secrets of a finished or vanished job, an idempotency
-- key without TTL. Everything is re-checked here, so a key that changed since SCAN is left alone.
--
--! keys each (key, job): key(key) key(job)
-- (item i: a key SCAN found, and the job:{jid} record it belongs to; the key itself for job
-- records and idempotency keys)
-- ARGV[1] one kind letter per item: j job record, o output stream, s secrets, i idempotency key
-- ARGV[2] terminal ttl ms   ARGV[3] idempotency ttl ms   ARGV[4] finished output ttl ms
-- Returns {records given a TTL, streams given a TTL, secrets deleted, idempotency keys given a TTL}

local TERMINAL = {succeeded = true, failed = true, cancelled = true}
local fixed = {0, 0, 0, 0}
local kinds = ARGV[1]
for i = 1, #kinds do
  local kind, k = string.sub(kinds, i, i), each_keys(i)
  local key = k.key
  if redis.call('PTTL', key) == -1 then
    local st = false
    if kind ~= 'i' then st = redis.call('HGET', k.job, 'st') end
    local finished = (not st) or TERMINAL[st]
    if kind == 'j' and st and TERMINAL[st] then
      redis.call('PEXPIRE', key, ARGV[2]); fixed[1] = fixed[1] + 1
    elseif kind == 'o' and finished then
      redis.call('PEXPIRE', key, ARGV[4]); fixed[2] = fixed[2] + 1
    elseif kind == 's' and finished then
      redis.call('DEL', key); fixed[3] = fixed[3] + 1
    elseif kind == 'i' then
      redis.call('PEXPIRE', key, ARGV[3]); fixed[4] = fixed[4] + 1
    end
  end
end
return fixed
