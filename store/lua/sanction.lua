-- sanction.lua: set one field of a sanctions hash (a user's ban / rev, or a
-- room's mutes by user), and keep the key until the latest moment any field
-- still matters.
-- KEYS[1] ns:san:{user} or ns:rmute:{room}   ARGV[1] field   ARGV[2] value (unix s)
-- ARGV[3] keep the key at least until this unix time (0: until ARGV[2])
-- ARGV[4] "max": the field only ever moves later; "set": as given
local field, value = ARGV[1], tonumber(ARGV[2])
local keep = tonumber(ARGV[3])
if keep == 0 then keep = value end
if ARGV[4] == 'max' then
  local old = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
  if old > value then value = old end
end
redis.call('HSET', KEYS[1], field, tostring(value))
local now = tonumber(redis.call('TIME')[1])
local ttl = redis.call('TTL', KEYS[1])
local want = math.ceil(keep - now) + 1
if want > 0 and (ttl < 0 or ttl < want) then
  redis.call('EXPIRE', KEYS[1], want)
end
return 1
