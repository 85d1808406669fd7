-- conversations.lua: the newest conversations with unread counts.
-- KEYS[1] conversations zset   KEYS[2] last message hash   KEYS[3] unread hash
-- ARGV[1] how many   ARGV[2] the highest last mid to list ('+inf': from the newest)
-- Returns {total, conv, mid, unread, last, conv, mid, unread, last, ...}
-- (mid: the conversation's last mid, as a string).
local convs = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], '-inf', 'WITHSCORES',
                         'LIMIT', 0, tonumber(ARGV[1]))
local out = {tonumber(redis.call('HGET', KEYS[3], '*') or '0')}
for i = 1, #convs, 2 do
  local conv = convs[i]
  out[#out + 1] = conv
  out[#out + 1] = convs[i + 1]
  out[#out + 1] = tonumber(redis.call('HGET', KEYS[3], conv) or '0')
  out[#out + 1] = redis.call('HGET', KEYS[2], conv) or false
end
return out
