-- release.lua: fenced release of a session's lease; re-notifies when work remains.
--
-- ARGV[1] lease value   ARGV[2] session   ARGV[3] now_ms
-- Returns 1 released | 0 lost (nothing written)
-- Touches: lease:{s}, active, sq:{s} (read), sess:{s} (nid), delayed (read), ready or an idle worker (see notify).

if not owns(ARGV[2], ARGV[1]) then return 0 end
release(ARGV[2], ARGV[3])
return 1
