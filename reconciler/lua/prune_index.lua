-- prune_index.lua: drop session-index members whose session hash is gone (nothing else removes
-- them; enqueue writes the hash and the member together, so a member without a hash is stale).
--
--! keys of (env): index(env)
--! keys each (s): sess(s)
-- ARGV: the session ids found without a hash by the survey (item i: sess:{s} of ARGV[i])
-- Returns the number of members removed.
-- Touches: sessions:{env}, sess:{s} of each id (read).

local n = 0
for i = 1, #ARGV do
  if redis.call('EXISTS', each_keys(i).sess) == 0 then
    n = n + redis.call('ZREM', K_INDEX, ARGV[i])
  end
end
return n
