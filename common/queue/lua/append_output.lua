-- append_output.lua: fenced append of one output chunk to a job's capped output stream.
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid   ARGV[4] stream (stdout|stderr)
-- ARGV[5] data
-- Returns the entry id, or false when the lease is lost (nothing written).
-- Touches: lease:{s} (read), job:{jid} (read), out:{jid}, obytes:{principal} (the output bytes
-- quota: counted over TTL_MS from the first byte, as long as output is kept).

if not owns(ARGV[2], ARGV[1]) then return false end
local principal = redis.call('HGET', job_key(ARGV[3]), 'pr')
if principal then
  local size = string.len(ARGV[5])
  if redis.call('INCRBY', obytes_key(principal), size) == size then
    redis.call('PEXPIRE', obytes_key(principal), TTL_MS)
  end
end
return redis.call('XADD', out_key(ARGV[3]), 'MAXLEN', '~', OUT_MAXLEN, '*',
  'stream', ARGV[4], 'data', ARGV[5])
