-- offline_ack.lua: drop entries the client has received.
-- KEYS[1] offline zset   KEYS[2] offline meta hash
-- ARGV[1] 'upto' or 'mids'; then ARGV[2] the bound, or ARGV[2..n] the mids.
-- The floor rises to the highest mid dropped, so sync below it goes to Mongo.
-- 'x' counts the removal (offline_fill.lua does not put back what it read
-- from MongoDB before it); only on a store with a floor: an ack of a store
-- that vouches for nothing removes nothing.
local function fmt(n) return string.format('%.0f', n) end
local high = 0
if ARGV[1] == 'upto' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
  high = tonumber(ARGV[2])
else
  for i = 2, #ARGV do
    redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[i], ARGV[i])
    high = math.max(high, tonumber(ARGV[i]))
  end
end
local floor = redis.call('HGET', KEYS[2], 'floor')
if floor then
  redis.call('HINCRBY', KEYS[2], 'x', 1)
  if tonumber(floor) < high then
    redis.call('HSET', KEYS[2], 'floor', fmt(high))
  end
end
return 1
