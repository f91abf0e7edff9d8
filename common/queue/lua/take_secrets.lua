-- take_secrets.lua: fenced read of a job's per-call secrets. They stay until the job ends
-- (`finish` deletes them; their TTL, the job TTL, is the backstop), so a start that never reached
-- the guest is retried with them.
--
--! keys of (s, j): lease(s) sec(j)
-- ARGV[1] lease value
-- Returns {'ok', json or ''} | {'lost'} (nothing read)
-- Touches: lease:{s} (read), sec:{jid} (read).

if not owns(K_LEASE, ARGV[1]) then return {'lost'} end
return {'ok', redis.call('GET', K_SEC) or ''}
