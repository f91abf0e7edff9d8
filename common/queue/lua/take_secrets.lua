-- take_secrets.lua: fenced read of a job's per-call secrets. They stay until the job ends
-- (`finish` deletes them; their TTL, the job TTL, is the backstop), so a start that never reached
-- the guest is retried with them.
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid
-- Returns {'ok', json or ''} | {'lost'} (nothing read)
-- Touches: lease:{s} (read), sec:{jid} (read).

if not owns(ARGV[2], ARGV[1]) then return {'lost'} end
return {'ok', redis.call('GET', sec_key(ARGV[3])) or ''}
