-- room_read.lua: a room's epoch, last pos and (ARGV[1] = 1) kept messages, at
-- one instant. KEYS[1] ns:rm:{room}   KEYS[2] ns:rh:{room}
-- Returns {epoch or false, last pos, message...} (oldest first).
local meta = redis.call('HMGET', KEYS[1], 'e', 'p')
local out = {meta[1], tonumber(meta[2] or '0')}
if meta[1] and ARGV[1] == '1' then
  for _, m in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do out[#out + 1] = m end
end
return out
