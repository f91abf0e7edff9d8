-- capacity_turn.lua: a resume that found no free Substrate worker takes (or keeps) its place in
-- the fair wait queue and, while fewer parks are in flight than sessions waiting up to and
-- including it, picks the running session idle longest to park: no job queued or running, no
-- owner, idle at least the minimum, and no background process unless its environment allows
-- suspending them. The pick is marked in flight, so no other waiter picks it too.
--
--! keys: capacity_wait capacity_told parking running
-- ARGV[1] waiting session   ARGV[2] now_ms   ARGV[3] its place: unix ms its job was created (a
--         re-run of the job after its worker died takes the same place again)
-- ARGV[4] minimum idle ms   ARGV[5] ms after which a park in flight is forgotten (its job died
--         with its worker and is re-run by queue repair; the waiter may pick another)
-- ARGV[6] how many waiters at the front are checked for a lease   ARGV[7] the session this waiter
--         asked to park last, or ''   ARGV[8] 1 on its first turn in this run of its job: a
--         told mark an earlier run left (its worker died) is dropped
-- ARGV[9..] environments whose sessions may be parked while background processes run
-- Returns {rank (0 = first in line), session to park or '' (always '' when ARGV[7] is given),
-- 1 while the park ARGV[7] names is still in flight, else 0}
-- Touches: capacity:wait, capacity:told, capacity:parking, running; reads lease:{s} of the first
-- waiters, and sess:{s}, lease:{s}, sq:{s} of the running sessions (as many as Substrate has
-- workers busy; computed: sessions read from capacity:wait and running).

local me, now = ARGV[1], tonumber(ARGV[2])
-- A waiting resume holds its session's lease; one at the front without it died with its worker
-- (its job's re-run takes its place again) or was cancelled: it must not hold up the line.
for _, s in ipairs(redis.call('ZRANGE', K_CAPACITY_WAIT, 0, tonumber(ARGV[6]) - 1)) do
  if s ~= me and redis.call('EXISTS', lease_key(s)) == 0 then redis.call('ZREM', K_CAPACITY_WAIT, s) end
end
redis.call('ZADD', K_CAPACITY_WAIT, 'NX', tonumber(ARGV[3]), me)
if ARGV[8] == '1' then redis.call('ZREM', K_CAPACITY_TOLD, me) end
local rank = redis.call('ZRANK', K_CAPACITY_WAIT, me)
redis.call('ZREMRANGEBYSCORE', K_PARKING, '-inf', now - tonumber(ARGV[5]))
-- A waiter whose park is in flight gets no other (parks in flight never outnumber the waiters);
-- one whose park has ended may get another at its next turn.
if ARGV[7] ~= '' then return {rank, '', redis.call('ZSCORE', K_PARKING, ARGV[7]) and 1 or 0} end
if redis.call('ZCARD', K_PARKING) > rank then return {rank, '', 0} end
local background_ok = {}
for i = 9, #ARGV do background_ok[ARGV[i]] = true end
local min_idle = tonumber(ARGV[4])
local best, best_at = '', nil
for _, s in ipairs(redis.call('ZRANGE', K_RUNNING, 0, -1)) do
  local f = redis.call('HMGET', sess_key(s), 'state', 'last_activity', 'background_processes')
  if f[1] ~= 'running' then
    redis.call('ZREM', K_RUNNING, s)
  elseif not redis.call('ZSCORE', K_PARKING, s) and redis.call('EXISTS', lease_key(s)) == 0
      and redis.call('LLEN', fifo_key(s)) == 0 then
    local last = (tonumber(f[2]) or 0) * 1000
    local quiet = not f[3] or f[3] == '' or f[3] == '[]' or background_ok[string.match(s, '^[^/]+')]
    if quiet and now - last >= min_idle and (best_at == nil or last < best_at) then
      best, best_at = s, last
    end
  end
end
if best ~= '' then redis.call('ZADD', K_PARKING, now, best) end
return {rank, best, 0}
