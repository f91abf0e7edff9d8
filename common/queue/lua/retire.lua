-- retire.lua: a worker stops taking work: its announcement is withdrawn and the sessions handed
-- to it that it has not taken from its inbox are released (handed on at once); then, if asked, a
-- wake-up (an empty entry) is pushed so its blocked inbox read returns.
--
--! keys: idle idle_until active delayed ready events callbacks
--! keys of (w): inbox(w)
-- ARGV[1] worker id   ARGV[2] now_ms   ARGV[3] '1' push the wake-up | '0' (a worker starting)
-- Returns the number of sessions released.
-- Touches: idle, idle_until, inbox:{worker}; per handed session (computed: read from the inbox):
-- lease:{s}, active, sq:{s}, sess:{s} (nid), ready or an idle worker (see notify).

local worker = ARGV[1]
forget_worker(worker)
local n = hand_back(K_INBOX, worker, ARGV[2])
if ARGV[3] == '1' then redis.call('RPUSH', K_INBOX, '') end
return n
