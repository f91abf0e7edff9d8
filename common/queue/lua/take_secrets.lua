-- take_secrets.lua: fenced read-and-delete of a job's per-call secrets.
--
-- KEYS[1] lease:{sess}   KEYS[2] sec:{jid}
-- ARGV[1] lease value
-- Returns {'ok', json or ''} | {'lost'} (nothing read or deleted)

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {'lost'} end
local v = redis.call('GET', KEYS[2])
redis.call('DEL', KEYS[2])
return {'ok', v or ''}
