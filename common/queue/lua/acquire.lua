-- acquire.lua: consume one `ready` entry; take the session's lease (new epoch) and its head job.
--
-- KEYS[1] ready   KEYS[2] lease:{sess}   KEYS[3] sess:{sess}   KEYS[4] sq:{sess}
-- KEYS[5] delayed   KEYS[6] active   KEYS[7] events
-- ARGV[1] ready entry id   ARGV[2] session "env/sid"   ARGV[3] worker id   ARGV[4] lease ttl ms
-- ARGV[5] now_ms
-- Returns {'ok', epoch, jid, field, value, ...} (the head job, now running under epoch)
--      or {'owned'} (another worker holds the lease; it re-notifies on release)
--      or {'delayed'} (backing off; `delayed` re-notifies when due) or {'empty'}.
-- Also touches: job:{head} (state running, epoch, started), the head's `events` entry.

local session, now = ARGV[2], tonumber(ARGV[5])
redis.call('XACK', KEYS[1], GROUP, ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[3], 'nid') == ARGV[1] then redis.call('HDEL', KEYS[3], 'nid') end
if redis.call('EXISTS', KEYS[2]) == 1 then return {'owned'} end
local due = redis.call('ZSCORE', KEYS[5], session)
if due then
  if tonumber(due) > now then return {'delayed'} end
  redis.call('ZREM', KEYS[5], session)
end
if redis.call('LLEN', KEYS[4]) == 0 then return {'empty'} end
local epoch = redis.call('HINCRBY', KEYS[3], 'epoch', 1)
redis.call('SET', KEYS[2], ARGV[3] .. ':' .. epoch, 'PX', ARGV[4])
redis.call('ZADD', KEYS[6], now + tonumber(ARGV[4]), session)
local head = take_head(session, epoch, ARGV[5], KEYS[7])
if not head then
  release(session, KEYS[2], KEYS[6], KEYS[1], KEYS[5])
  return {'empty'}
end
local out = {'ok', epoch}
for _, v in ipairs(head) do table.insert(out, v) end
return out
