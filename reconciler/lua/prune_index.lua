-- prune_index.lua: drop session-index members whose session hash is gone (nothing else removes
-- them; enqueue writes the hash and the member together, so a member without a hash is stale).
--
-- KEYS[1] sessions:{env}
-- ARGV[1] session name prefix "env/"   then session ids found without a hash by the survey
-- Returns the number of members removed.
-- Also touches (reads): sess:{s} of each id.

local n = 0
for i = 2, #ARGV do
  if redis.call('EXISTS', sess_key(ARGV[1] .. ARGV[i])) == 0 then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n
