-- counter_merge.lua: add MongoDB's flushed counts to a hash that lacks them.
-- KEYS[1] the post's counter hash   ARGV[1..3]: r, c, l as flushed to MongoDB
-- ARGV[4] the hash's TTL (s), refreshed (a post read again stays cached)
-- Returns {r, c, l} now.
if redis.call('HGET', KEYS[1], 'ok') ~= '1' then
  redis.call('HINCRBY', KEYS[1], 'r', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'c', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'l', ARGV[3])
  redis.call('HSET', KEYS[1], 'ok', '1')
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return redis.call('HMGET', KEYS[1], 'r', 'c', 'l')
