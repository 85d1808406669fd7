-- read_seq.lua: a member has read a group up to a seq; it never moves back.
-- KEYS[1] the user's groups hash (GROUP -> from_seq, 'r:' .. GROUP -> read seq)
-- ARGV[1] group   ARGV[2] seq read up to   ARGV[3] the hash's TTL (s), refreshed
-- Returns the read seq now in force, or false if the user is not a member.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return false
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
local field = 'r:' .. ARGV[1]
local cur = tonumber(redis.call('HGET', KEYS[1], field) or '0')
if tonumber(ARGV[2]) > cur then
  redis.call('HSET', KEYS[1], field, ARGV[2])
  return tonumber(ARGV[2])
end
return cur
