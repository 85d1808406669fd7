-- reaction.lua: one user's reaction on one shard of a message's reactions.
-- KEYS[1] counts hash: emoji -> count, and '~' once the shard was built from
--         MongoDB (reaction_build.lua)
-- KEYS[2] set of "user|emoji" (who reacted with what, on this shard)
-- ARGV[1] "user|emoji"   ARGV[2] emoji   ARGV[3] '1' add, '0' remove
-- ARGV[4] the keys' TTL (s)
-- Returns -1 if the shard is not built (the caller builds it and calls
-- again), 1 if the reaction changed, 0 if it was already so: the same state
-- twice changes nothing.
if redis.call('HEXISTS', KEYS[1], '~') == 0 then
  return -1
end
local changed
if ARGV[3] == '1' then
  changed = redis.call('SADD', KEYS[2], ARGV[1])
  if changed == 1 then
    redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
  end
else
  changed = redis.call('SREM', KEYS[2], ARGV[1])
  if changed == 1 and redis.call('HINCRBY', KEYS[1], ARGV[2], -1) <= 0 then
    redis.call('HDEL', KEYS[1], ARGV[2])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return changed
