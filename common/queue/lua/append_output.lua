-- append_output.lua: fenced append of one output chunk to a job's capped output stream.
--
--! keys of (s, j): lease(s) job(j) out(j)
-- ARGV[1] lease value   ARGV[2] stream (stdout|stderr)   ARGV[3] data
-- Returns the entry id, or false when the lease is lost (nothing written).
-- Touches: lease:{s} (read), job:{jid} (read), out:{jid}; obytes:{principal} (computed: the
-- principal read from the job; the output bytes quota, counted over TTL_MS from the first byte,
-- as long as output is kept).

if not owns(K_LEASE, ARGV[1]) then return false end
local principal = redis.call('HGET', K_JOB, 'pr')
if principal then
  local size = string.len(ARGV[3])
  local ok = obytes_key(principal)
  if redis.call('INCRBY', ok, size) == size then
    redis.call('PEXPIRE', ok, TTL_MS)
  end
end
return redis.call('XADD', K_OUT, 'MAXLEN', '~', OUT_MAXLEN, '*', 'stream', ARGV[2], 'data', ARGV[3])
