-- append_output.lua: fenced append of one output chunk to a job's capped output stream.
--
-- KEYS[1] lease:{sess}   KEYS[2] out:{jid}
-- ARGV[1] lease value   ARGV[2] maxlen   ARGV[3] stream name (stdout|stderr)   ARGV[4] data
-- Returns the entry id, or false when the lease is lost (nothing written).

if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'stream', ARGV[3], 'data', ARGV[4])
