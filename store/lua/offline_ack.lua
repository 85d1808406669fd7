-- offline_ack.lua: drop entries the client has received.
-- KEYS[1] offline zset   KEYS[2] offline meta hash
-- ARGV[1] 'upto' or 'mids'; then ARGV[2] the bound, or ARGV[2..n] the mids.
-- The floor rises to the highest mid dropped, so sync below it goes to Mongo.
-- An ack does not move 'x': a fill read before it (offline_fill.lua) may put
-- acked entries back, which a later sync sends again (clients drop repeats
-- by mid); clients ack every push, so counting acks would stop every fill.
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
if floor and tonumber(floor) < high then
  redis.call('HSET', KEYS[2], 'floor', fmt(high))
end
return 1
