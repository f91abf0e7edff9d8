-- append_output.lua: fenced append of one output chunk to a job's capped output stream.
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] jid   ARGV[4] stream (stdout|stderr)
-- ARGV[5] data
-- Returns the entry id, or false when the lease is lost (nothing written).
-- Touches: lease:{s} (read), out:{jid}.

if not owns(ARGV[2], ARGV[1]) then return false end
return redis.call('XADD', out_key(ARGV[3]), 'MAXLEN', '~', OUT_MAXLEN, '*',
  'stream', ARGV[4], 'data', ARGV[5])
