-- conv_settings.lua: a user's settings of its conversations.
-- KEYS[1] hash: conv -> letters ("m" muted, "p" pinned, "a" archived),
--         '~' once complete (filled from MongoDB), 'v' counts changes
-- ARGV[1] 'set': ARGV[3] conv, ARGV[4] its letters ('' : none); the change
--         is written only where the hash is complete, 'v' always moves on
--         (a fill that read MongoDB before the change does not land)
-- ARGV[1] 'fill': ARGV[3] the 'v' the caller read before it read MongoDB,
--         then conv, letters pairs: written (and '~') only if 'v' is still
--         that one and the hash is not complete. Returns 1 if written.
-- ARGV[2] the hash's TTL (s)
local ttl = ARGV[2]
if ARGV[1] == 'set' then
  redis.call('HINCRBY', KEYS[1], 'v', 1)
  if redis.call('HEXISTS', KEYS[1], '~') == 1 then
    if ARGV[4] == '' then
      redis.call('HDEL', KEYS[1], 'c:' .. ARGV[3])
    else
      redis.call('HSET', KEYS[1], 'c:' .. ARGV[3], ARGV[4])
    end
  end
  redis.call('EXPIRE', KEYS[1], ttl)
  return 1
end
if redis.call('HEXISTS', KEYS[1], '~') == 1 then
  return 0
end
local v = redis.call('HGET', KEYS[1], 'v') or ''
if v ~= ARGV[3] then
  return 0
end
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], '~', 1)
redis.call('EXPIRE', KEYS[1], ttl)
return 1
