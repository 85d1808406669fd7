-- room_append.lua: positions and history for one room's messages of a window.
-- KEYS[1] ns:rm:{room} (hash: e = epoch, p = last pos)   KEYS[2] ns:rh:{room} (list)
-- ARGV[1] an epoch for the room if it has none (new, or its state was lost)
-- ARGV[2] messages kept   ARGV[3] their time to live (ms)   ARGV[4] the hash's (s)
-- ARGV[5..] the messages, each a JSON object ('{...}')
-- Each message gets the next pos, written into it ('{...,"pos":N}'), and is
-- appended to the history, trimmed to ARGV[2]. Returns {epoch, first pos}.
local epoch = redis.call('HGET', KEYS[1], 'e')
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', KEYS[1], 'e', epoch, 'p', 0)
  redis.call('DEL', KEYS[2])  -- kept messages of a lost epoch are not this one's
end
local n = #ARGV - 4
local last = redis.call('HINCRBY', KEYS[1], 'p', n)
local first = last - n + 1
local chunk = {}
for i = 1, n do
  local f = ARGV[4 + i]
  chunk[#chunk + 1] = string.sub(f, 1, -2) .. ',"pos":' .. (first + i - 1) .. '}'
  if #chunk == 1000 or i == n then  -- unpack() has a stack limit
    redis.call('RPUSH', KEYS[2], unpack(chunk))
    chunk = {}
  end
end
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {epoch, first}
