-- take_secrets.lua: fenced read-and-delete of a job's per-call secrets.
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid
-- Returns {'ok', json or ''} | {'lost'} (nothing read or deleted)
-- Touches: lease:{s} (read), sec:{jid}.

if not owns(ARGV[2], ARGV[1]) then return {'lost'} end
local k = sec_key(ARGV[3])
local v = redis.call('GET', k)
redis.call('DEL', k)
return {'ok', v or ''}
