-- release.lua: fenced release of a session's lease; re-notifies when work remains.
--
--! keys: active delayed idle idle_until ready events callbacks
--! keys of (s): lease(s) fifo(s) sess(s)
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] now_ms
-- Returns 1 released | 0 lost (nothing written)
-- Touches: lease:{s}, active, sq:{s} (read), sess:{s} (nid), delayed (read), ready or an idle
-- worker (see notify).

if not owns(K_LEASE, ARGV[1]) then return 0 end
release({id = ARGV[2], fifo = K_FIFO, sess = K_SESS, lease = K_LEASE}, ARGV[3])
return 1
