-- erase.lua: one message leaves one user's Redis view: recalled (a tombstone
-- in its place) or deleted for this user.
-- KEYS[1] offline zset   KEYS[2] conversations zset   KEYS[3] last message hash
-- KEYS[4] inbox meta hash KEYS[5] unread zset (see deliver.lua)
-- KEYS[6] offline meta hash: 'x' counts the erasure, so a fill of the
--         offline store from MongoDB read before it (offline_fill.lua) does
--         not put the message back as it was
-- ARGV[1] mid   ARGV[2] conv
-- ARGV[3] 'recall': ARGV[4] is the tombstone (offline entry and, if it was the
--         conversation's last, the last message)
--         'forget': the offline entry goes; if it was the conversation's last,
--         ARGV[4] (the newest message left, ARGV[5] its mid) replaces it, or
--         with ARGV[4] empty the conversation leaves the list
-- ARGV[6] the unread member of the mid   ARGV[7] the inbox keys' TTL seconds
-- Unread: a mid still unread is no longer counted. On inbox keys not
-- complete, 'v' is bumped (a rebuild that read MongoDB before the erasure
-- started over). Returns the conversation's unread count.
local mid, conv = ARGV[1], ARGV[2]
redis.call('HINCRBY', KEYS[6], 'x', 1)
if redis.call('TTL', KEYS[6]) < 0 then
  redis.call('EXPIRE', KEYS[6], ARGV[7])
end
local had = redis.call('ZCOUNT', KEYS[1], mid, mid) > 0
if had then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], mid, mid)
  if ARGV[3] == 'recall' then
    redis.call('ZADD', KEYS[1], mid, ARGV[4])
  end
end
if string.sub(conv, 1, 2) == 'g:' then
  return 0  -- a group's row is the group state's; a group has no unread here
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
redis.call('ZREM', KEYS[5], ARGV[6])
if redis.call('HEXISTS', KEYS[4], '~') == 0 then
  redis.call('HINCRBY', KEYS[4], 'v', 1)
end
for i = 2, 5 do redis.call('EXPIRE', KEYS[i], ARGV[7]) end
return redis.call('ZLEXCOUNT', KEYS[5], '[' .. conv .. '|', '(' .. conv .. '|:')
