-- renew.lua: renew many leases of one worker in one round trip.
--
--! keys: active
--! keys each (s, j): lease(s) job(j)
-- ARGV[1] now_ms   then triples: session, lease value, running jid or '' (its job key, declared
-- as job(''), is then never read)
-- Returns one integer per session: 0 lost, 1 renewed, 2 renewed and its job has a cancel request.
-- Touches: lease:{s} (PEXPIRE), active, job:{jid} (read `cx`).

local now = tonumber(ARGV[1])
local out = {}
for i = 1, (#ARGV - 1) / 3 do
  local k, b = each_keys(i), 3 * i - 1
  if owns(k.lease, ARGV[b + 1]) then
    redis.call('PEXPIRE', k.lease, LEASE_TTL_MS)
    redis.call('ZADD', K_ACTIVE, now + LEASE_TTL_MS, ARGV[b])
    if ARGV[b + 2] ~= '' and redis.call('HGET', k.job, 'cx') == '1' then
      table.insert(out, 2)
    else
      table.insert(out, 1)
    end
  else
    table.insert(out, 0)
  end
end
return out
