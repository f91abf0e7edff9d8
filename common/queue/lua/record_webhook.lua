-- record_webhook.lua: append one webhook delivery attempt to the job's `wh` JSON list.
--
--! keys of (j): job(j)
-- ARGV[1] attempt JSON object
-- Returns the number of recorded attempts, or 0 when the job record is gone.
-- Touches: job:{jid}.

if redis.call('EXISTS', K_JOB) == 0 then return 0 end
local raw = redis.call('HGET', K_JOB, 'wh')
local list = {}
if raw then list = cjson.decode(raw) end
table.insert(list, cjson.decode(ARGV[1]))
redis.call('HSET', K_JOB, 'wh', cjson.encode(list))
return #list
