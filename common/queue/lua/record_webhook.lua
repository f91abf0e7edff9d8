-- record_webhook.lua: append one webhook delivery attempt to the job's `wh` JSON list.
--
-- ARGV[1] jid   ARGV[2] attempt JSON object
-- Returns the number of recorded attempts, or 0 when the job record is gone.
-- Touches: job:{jid}.

local jk = job_key(ARGV[1])
if redis.call('EXISTS', jk) == 0 then return 0 end
local raw = redis.call('HGET', jk, 'wh')
local list = {}
if raw then list = cjson.decode(raw) end
table.insert(list, cjson.decode(ARGV[2]))
redis.call('HSET', jk, 'wh', cjson.encode(list))
return #list
