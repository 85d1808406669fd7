-- erase.lua: one message leaves one user's Redis view: recalled (a tombstone
-- in its place) or deleted for this user.
-- KEYS[1] offline zset   KEYS[2] conversations zset   KEYS[3] last message hash
-- KEYS[4] unread hash     KEYS[5] unread mids zset of the conversation
-- ARGV[1] mid   ARGV[2] conv
-- ARGV[3] 'recall': ARGV[4] is the tombstone (offline entry and, if it was the
--         conversation's last, the last message)
--         'forget': the offline entry goes; if it was the conversation's last,
--         ARGV[4] (the newest message left, ARGV[5] its mid) replaces it, or
--         with ARGV[4] empty the conversation leaves the list
-- Unread: a mid still unread is no longer counted (count and total move
-- together, as read.lua moves them). Returns the conversation's unread count.
local mid, conv = ARGV[1], ARGV[2]
local had = redis.call('ZCOUNT', KEYS[1], mid, mid) > 0
if had then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], mid, mid)
  if ARGV[3] == 'recall' then
    redis.call('ZADD', KEYS[1], mid, ARGV[4])
  end
end
local last = redis.call('ZSCORE', KEYS[2], conv)
if last and tonumber(last) == tonumber(mid) then
  if ARGV[3] == 'recall' then
    redis.call('HSET', KEYS[3], conv, ARGV[4])
  elseif ARGV[4] ~= '' then
    redis.call('HSET', KEYS[3], conv, ARGV[4])
    redis.call('ZADD', KEYS[2], ARGV[5], conv)
  else
    redis.call('HDEL', KEYS[3], conv)
    redis.call('ZREM', KEYS[2], conv)
  end
end
if redis.call('ZREM', KEYS[5], mid) == 0 then
  return tonumber(redis.call('HGET', KEYS[4], conv) or '0')
end
local count = redis.call('ZCARD', KEYS[5])
local before = tonumber(redis.call('HGET', KEYS[4], conv) or '0')
if count == 0 then
  redis.call('HDEL', KEYS[4], conv)
else
  redis.call('HSET', KEYS[4], conv, count)
end
if count ~= before then
  local total = redis.call('HINCRBY', KEYS[4], '*', count - before)
  if total <= 0 then redis.call('HDEL', KEYS[4], '*') end
end
return count
