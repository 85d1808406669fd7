-- counter.lua: one post counter moves (counts live in Redis and are
-- flushed to MongoDB in the background).
-- KEYS[1] the post's counter hash (r, c, l, and ok once merged with MongoDB)
-- KEYS[2] the set (of its shard: same hash tag) of posts whose counters changed
--         since the last flush
-- ARGV[1] field   ARGV[2] delta   ARGV[3] post id   ARGV[4] the hash's TTL (s),
-- refreshed (far longer than a flush takes: what expires was flushed)
-- A hash without `ok` holds only the changes since Redis lost it: the reader
-- merges MongoDB's flushed values into it (counter_merge.lua), so no change
-- is lost or counted twice.
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[3])
return n
