-- renew.lua: renew many leases of one worker in one round trip.
--
-- KEYS[1] active
-- ARGV[1] lease ttl ms   ARGV[2] now_ms   then triples: session, lease value, running jid or ''
-- Returns one integer per session: 0 lost, 1 renewed, 2 renewed and its job has a cancel request.
-- Also touches: lease:{sess} (PEXPIRE), job:{jid} (read `cx`).

local ttl, now = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 3 do
  local session, value, jid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local lk = lease_key(session)
  if redis.call('GET', lk) == value then
    redis.call('PEXPIRE', lk, ttl)
    redis.call('ZADD', KEYS[1], now + tonumber(ttl), session)
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
