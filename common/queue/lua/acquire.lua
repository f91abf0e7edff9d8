-- acquire.lua: consume one `ready` entry; take the session's lease (new epoch) and its head job.
--
-- ARGV[1] ready entry id   ARGV[2] session "env/sid"   ARGV[3] worker id   ARGV[4] now_ms
-- Returns {'ok', epoch, jid, field, value, ...} (the head job, now running under epoch)
--      or {'owned'} (another worker holds the lease; it re-notifies on release)
--      or {'delayed'} (backing off; `delayed` re-notifies when due) or {'empty'}.
-- Touches: ready (ack + delete the entry), sess:{s} (nid, epoch), lease:{s}, active, delayed,
-- sq:{s} (read), job:{head} (state running, epoch, started), events.

local session, now = ARGV[2], tonumber(ARGV[4])
local sk = sess_key(session)
redis.call('XACK', K_READY, GROUP, ARGV[1])
redis.call('XDEL', K_READY, ARGV[1])
if redis.call('HGET', sk, 'nid') == ARGV[1] then redis.call('HDEL', sk, 'nid') end
local lk = lease_key(session)
if redis.call('EXISTS', lk) == 1 then return {'owned'} end
local due = redis.call('ZSCORE', K_DELAYED, session)
if due then
  if tonumber(due) > now then return {'delayed'} end
  redis.call('ZREM', K_DELAYED, session)
end
if redis.call('LLEN', fifo_key(session)) == 0 then return {'empty'} end
local epoch = redis.call('HINCRBY', sk, 'epoch', 1)
redis.call('SET', lk, ARGV[3] .. ':' .. epoch, 'PX', LEASE_TTL_MS)
redis.call('ZADD', K_ACTIVE, now + LEASE_TTL_MS, session)
local head = take_head(session, epoch, ARGV[4])
if not head then
  release(session)
  return {'empty'}
end
local out = {'ok', epoch}
for _, v in ipairs(head) do table.insert(out, v) end
return out
