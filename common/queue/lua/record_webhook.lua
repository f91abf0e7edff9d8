-- record_webhook.lua: append one webhook delivery attempt to the job's `wh` JSON list.
--
-- KEYS[1] job:{jid}
-- ARGV[1] attempt JSON object
-- Returns the number of recorded attempts, or 0 when the job record is gone.

if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local raw = redis.call('HGET', KEYS[1], 'wh')
local list = {}
if raw then list = cjson.decode(raw) end
table.insert(list, cjson.decode(ARGV[1]))
redis.call('HSET', KEYS[1], 'wh', cjson.encode(list))
return #list
