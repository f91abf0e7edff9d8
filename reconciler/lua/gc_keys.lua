-- gc_keys.lua: repair keys that should expire but would not (found by SCAN): a terminal job
-- record or output stream without TTL, secrets of a finished or vanished job, an idempotency
-- key without TTL. Everything is re-checked here, so a key that changed since SCAN is left alone.
--
-- KEYS: pairs (key, job:{jid} of that key; the key itself for job and idempotency keys)
-- ARGV[1] one kind letter per pair: j job record, o output stream, s secrets, i idempotency key
-- ARGV[2] terminal ttl ms   ARGV[3] idempotency ttl ms   ARGV[4] finished output ttl ms
-- Returns {records given a TTL, streams given a TTL, secrets deleted, idempotency keys given a TTL}

local TERMINAL = {succeeded = true, failed = true, cancelled = true}
local fixed = {0, 0, 0, 0}
local kinds = ARGV[1]
for i = 1, #kinds do
  local kind, key, job = string.sub(kinds, i, i), KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('PTTL', key) == -1 then
    local st = false
    if kind ~= 'i' then st = redis.call('HGET', job, 'st') end
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
