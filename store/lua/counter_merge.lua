-- counter_merge.lua: add MongoDB's flushed counts to a hash that lacks them.
-- KEYS[1] the post's counter hash   ARGV: r, c, l as flushed to MongoDB
-- Returns {r, c, l} now.
if redis.call('HGET', KEYS[1], 'ok') ~= '1' then
  redis.call('HINCRBY', KEYS[1], 'r', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'c', ARGV[2])
  redis.call('HINCRBY', KEYS[1], 'l', ARGV[3])
  redis.call('HSET', KEYS[1], 'ok', '1')
end
return redis.call('HMGET', KEYS[1], 'r', 'c', 'l')
