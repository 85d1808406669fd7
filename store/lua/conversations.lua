-- conversations.lua: the newest conversations with unread counts.
-- KEYS[1] inbox meta hash   KEYS[2] unread zset   KEYS[3] conversations zset
-- KEYS[4] last message hash (as deliver.lua's KEYS[3..6])
-- ARGV[1] how many   ARGV[2] the inbox keys' TTL seconds (refreshed: a read is a use)
-- ARGV[3] the highest last mid to list ('+inf': from the newest)
-- Returns {complete (1/0), total, conv, mid, unread, last, conv, mid, unread, last, ...}
-- (mid: the conversation's last mid, as a string). Not complete: the keys
-- hold only what was written since they expired; the caller rebuilds them.
local complete = redis.call('HEXISTS', KEYS[1], '~')
if complete == 1 then
  for i = 1, 4 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
end
local convs = redis.call('ZREVRANGEBYSCORE', KEYS[3], ARGV[3], '-inf', 'WITHSCORES',
                         'LIMIT', 0, tonumber(ARGV[1]))
local out = {complete, redis.call('ZCARD', KEYS[2])}
for i = 1, #convs, 2 do
  local conv = convs[i]
  out[#out + 1] = conv
  out[#out + 1] = convs[i + 1]
  out[#out + 1] = redis.call('ZLEXCOUNT', KEYS[2], '[' .. conv .. '|', '(' .. conv .. '|:')
  out[#out + 1] = redis.call('HGET', KEYS[4], conv) or false
end
return out
