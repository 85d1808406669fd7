-- reaction_build.lua: one shard of a message's reactions, built from what
-- MongoDB holds (see reaction.lua for the keys).
-- ARGV[1] the keys' TTL (s), then "user|emoji", emoji pairs.
-- Only where the shard is not built: a shard built meanwhile (by another
-- node) is left as it is, and the caller applies its own reaction again
-- (idempotent) after this. Returns 1 if it built the shard.
if redis.call('HEXISTS', KEYS[1], '~') == 1 then
  return 0
end
redis.call('DEL', KEYS[2])
local counts = {}
for i = 2, #ARGV, 2 do
  redis.call('SADD', KEYS[2], ARGV[i])
  counts[ARGV[i + 1]] = (counts[ARGV[i + 1]] or 0) + 1
end
for emoji, n in pairs(counts) do
  redis.call('HSET', KEYS[1], emoji, n)
end
redis.call('HSET', KEYS[1], '~', 1)
redis.call('EXPIRE', KEYS[1], ARGV[1])
if #ARGV > 1 then
  redis.call('EXPIRE', KEYS[2], ARGV[1])
end
return 1
