-- read.lua: the user has read a conversation up to a mid.
-- KEYS[1] unread hash (conv -> count, '*' -> total)
-- KEYS[2] unread mids zset of this conversation
-- ARGV[1] conv   ARGV[2] mid read up to (inclusive)
-- Sets the conversation's count to the unread mids left after ARGV[2] and
-- moves the total by the same difference. Returns the new count.
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
local count = redis.call('ZCARD', KEYS[2])
local before = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if count == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], count)
end
if count ~= before then
  local total = redis.call('HINCRBY', KEYS[1], '*', count - before)
  if total <= 0 then redis.call('HDEL', KEYS[1], '*') end
end
return count
