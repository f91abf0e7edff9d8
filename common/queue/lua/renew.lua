-- renew.lua: renew many leases of one worker in one round trip.
--
-- ARGV[1] now_ms   then triples: session, lease value, running jid or ''
-- Returns one integer per session: 0 lost, 1 renewed, 2 renewed and its job has a cancel request.
-- Touches: lease:{s} (PEXPIRE), active, job:{jid} (read `cx`).

local now = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 3 do
  local session, value, jid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if owns(session, value) then
    redis.call('PEXPIRE', lease_key(session), LEASE_TTL_MS)
    redis.call('ZADD', K_ACTIVE, now + LEASE_TTL_MS, session)
    if jid ~= '' and redis.call('HGET', job_key(jid), 'cx') == '1' then
      table.insert(out, 2)
    else
      table.insert(out, 1)
    end
  else
    table.insert(out, 0)
  end
end
return out
