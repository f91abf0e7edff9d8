-- capacity_tell.lua: a Substrate worker was freed (or is about to be, by a park's suspend): the
-- waiter first in line that has not been told of one yet is told this one is its own, whichever
-- worker process it waits in. Told waiters ask Substrate at once; the others keep polling.
--
--! keys: capacity_wait capacity_told running
-- ARGV[1] now_ms   ARGV[2] the waiter a park told as its suspend began, or '': it keeps that
--         park's worker while it still waits (told again if its early resume was refused) or
--         once it resumed; the next waiter gets it if it left without resuming
-- ARGV[3] unix ms that waiter was told (it resumed since if `running` says so)
-- Returns the session told, or '' when the worker goes to nobody (see above; or every waiter
-- is told, or none waits, or none holds its lease)
-- Touches: capacity:told; reads capacity:wait, running, and lease:{s} of the waiters it passes
-- (computed: sessions read from capacity:wait).

local now, handed = tonumber(ARGV[1]), ARGV[2]
-- A told waiter that left the line (resumed, gave up, died with its lease) is told no more.
for _, s in ipairs(redis.call('ZRANGE', K_CAPACITY_TOLD, 0, -1)) do
  if not redis.call('ZSCORE', K_CAPACITY_WAIT, s) then redis.call('ZREM', K_CAPACITY_TOLD, s) end
end
if handed ~= '' then
  if redis.call('ZSCORE', K_CAPACITY_WAIT, handed) then
    if redis.call('ZSCORE', K_CAPACITY_TOLD, handed) then return '' end
    redis.call('ZADD', K_CAPACITY_TOLD, now, handed)
    return handed
  end
  local resumed = tonumber(redis.call('ZSCORE', K_RUNNING, handed))
  if resumed and resumed >= tonumber(ARGV[3]) then return '' end
end
local batch, from = 16, 0
while true do
  local line = redis.call('ZRANGE', K_CAPACITY_WAIT, from, from + batch - 1)
  if #line == 0 then return '' end
  for _, s in ipairs(line) do
    -- One without its lease died with its worker (its job's re-run takes its place again).
    if not redis.call('ZSCORE', K_CAPACITY_TOLD, s) and redis.call('EXISTS', lease_key(s)) == 1 then
      redis.call('ZADD', K_CAPACITY_TOLD, now, s)
      return s
    end
  end
  from = from + batch
end
