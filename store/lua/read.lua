-- read.lua: the user has read a conversation up to a mid.
-- KEYS[1] inbox meta hash   KEYS[2] unread zset   KEYS[3] conversations zset
-- KEYS[4] last message hash (KEYS[1..4] as deliver.lua's KEYS[3..6])
-- ARGV[1] conv   ARGV[2] the unread member of the mid read up to (inclusive)
-- ARGV[3] the inbox keys' TTL seconds
-- Drops the conversation's unread mids up to ARGV[2]. On keys not complete
-- (expired, or never rebuilt) the read is also kept in the meta hash, field
-- 'r|' .. conv (the highest member read up to: members of one conversation
-- sort by mid), so a rebuild that read MongoDB before this read drops those
-- mids again when it merges (inbox_fill.lua) instead of putting them back.
-- Returns {1 if the keys are complete else 0, unread left in the conversation}.
local lo = '[' .. ARGV[1] .. '|'
redis.call('ZREMRANGEBYLEX', KEYS[2], lo, '[' .. ARGV[2])
local count = redis.call('ZLEXCOUNT', KEYS[2], lo, '(' .. ARGV[1] .. '|:')
local complete = redis.call('HEXISTS', KEYS[1], '~')
if complete == 0 then
  local field = 'r|' .. ARGV[1]
  local was = redis.call('HGET', KEYS[1], field)
  if not was or was < ARGV[2] then
    redis.call('HSET', KEYS[1], field, ARGV[2])
  end
end
for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
return {complete, count}
